/* lt_crypto: LTE1 objects round-trip at every size boundary; every attack on the format
 * (truncation, dropped/reordered/swapped chunks, renamed object, other tenant, flipped bits,
 * wrong keys) is refused with LT_ERR_CORRUPT; the KEK/DEK envelope binds tenant and key ids;
 * the AES-256-GCM and SHA-256 primitives match published test vectors. */
#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_crypto.h"

static char err[512];

static lt_crypto_dek_t *dek_raw(const char *tenant, const char *kid, uint8_t fill) {
  uint8_t k[LT_CRYPTO_KEY_BYTES];
  memset(k, fill, sizeof k);
  lt_crypto_dek_t *d = NULL;
  cr_assert_eq(lt_crypto_dek_import(&d, tenant, kid, k, err, sizeof err), LT_OK, "%s", err);
  return d;
}

static uint8_t *pattern(size_t n, unsigned seed) {
  uint8_t *p = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31 + seed * 7 + (i >> 8));
  return p;
}

/* Seals with one-shot; returns malloc'd ciphertext. */
static uint8_t *seal(const lt_crypto_dek_t *d, const char *key, size_t chunk, const uint8_t *p,
                     size_t n, size_t *ct_len) {
  size_t cap = lt_crypto_sealed_size(d, n, chunk);
  uint8_t *ct = malloc(cap);
  cr_assert_eq(lt_crypto_seal(d, key, chunk, p, n, ct, cap, ct_len, err, sizeof err), LT_OK, "%s",
               err);
  cr_assert_eq(*ct_len, cap, "sealed size %zu != predicted %zu", *ct_len, cap);
  return ct;
}

static lt_err_t open_(const lt_crypto_dek_t *d, const char *key, const uint8_t *ct, size_t n,
                      uint8_t **pt, size_t *pt_len) {
  *pt = malloc(n ? n : 1);
  err[0] = 0;
  return lt_crypto_open(d, key, ct, n, *pt, n, pt_len, err, sizeof err);
}

static void roundtrip(size_t n, size_t chunk) {
  lt_crypto_dek_t *d = dek_raw("t1", "k1", 0x11);
  uint8_t *p = pattern(n, 1), *pt;
  size_t ct_len, pt_len;
  uint8_t *ct = seal(d, "tenants/t1/datasets/d1/data", chunk, p, n, &ct_len);
  cr_assert_eq(open_(d, "tenants/t1/datasets/d1/data", ct, ct_len, &pt, &pt_len), LT_OK,
               "size %zu chunk %zu: %s", n, chunk, err);
  cr_assert_eq(pt_len, n);
  cr_assert(n == 0 || memcmp(p, pt, n) == 0, "plaintext differs at size %zu", n);
  if (n) cr_assert(memmem(ct, ct_len, p, n < 16 ? n : 16) == NULL || n < 4,
                   "ciphertext contains the plaintext");
  free(p); free(pt); free(ct);
  lt_crypto_dek_destroy(d);
}

Test(crypto, roundtrip_empty_one_byte_exact_chunk_and_multi_chunk) {
  roundtrip(0, 64);
  roundtrip(1, 64);
  roundtrip(63, 64);
  roundtrip(64, 64);
  roundtrip(65, 64);
  roundtrip(128, 64);
  roundtrip(3 * 64 + 5, 64);
  roundtrip(0, 0);
  roundtrip(LT_CRYPTO_CHUNK_DEFAULT, 0);
  roundtrip(3 * LT_CRYPTO_CHUNK_DEFAULT + 12345, 0);
}

/* Feeds in[0..n) to a stream in pieces of step bytes, then next(step), ..., and finishes it,
 * through tmp (room for twice the largest piece); what came out goes to out (cap bytes); its length. */
static size_t stream_all(lt_crypto_stream_t *s, const uint8_t *in, size_t n, uint8_t *tmp, uint8_t *out, size_t cap,
                         size_t step, size_t (*next)(size_t)) {
  size_t len = 0, o;
  for (size_t off = 0; off < n; step = next(step)) {
    size_t take = step < n - off ? step : n - off;
    cr_assert_eq(lt_crypto_stream_update(s, in + off, take, tmp, lt_crypto_stream_out_max(s, take), &o, err,
                                         sizeof err), LT_OK, "%s", err);
    cr_assert_leq(len + o, cap);
    memcpy(out + len, tmp, o);
    len += o;
    off += take;
  }
  cr_assert_eq(lt_crypto_stream_final(s, tmp, lt_crypto_stream_out_max(s, 0), &o, err, sizeof err), LT_OK, "%s", err);
  cr_assert_leq(len + o, cap);
  memcpy(out + len, tmp, o);
  return len + o;
}

static size_t enc_next(size_t step) { return step * 3 + 7 > 50000 ? 1 : step * 3 + 7; }
static size_t dec_next(size_t step) { return step * 2 + 1 > 70000 ? 3 : step * 2 + 1; }

/* Streams with irregular update sizes in both directions; compares against one-shot. */
Test(crypto, streaming_in_irregular_pieces_matches_one_shot) {
  lt_crypto_dek_t *d = dek_raw("t1", "k1", 0x22);
  size_t n = 1000003, chunk = 4096;
  uint8_t *p = pattern(n, 2);
  lt_crypto_stream_t *enc, *dec;
  cr_assert_eq(lt_crypto_enc_new(&enc, d, "obj", chunk, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dec_new(&dec, d, "obj", err, sizeof err), LT_OK, "%s", err);
  size_t ct_cap = lt_crypto_sealed_size(d, n, chunk);
  uint8_t *ct = malloc(ct_cap), *pt = malloc(n);
  uint8_t *tmp = malloc(2 * n);
  size_t ct_len = stream_all(enc, p, n, tmp, ct, ct_cap, 1, enc_next);
  cr_assert_eq(ct_len, ct_cap);
  size_t pt_len = stream_all(dec, ct, ct_len, tmp, pt, n, 5, dec_next), o;
  cr_assert_eq(pt_len, n);
  cr_assert(memcmp(p, pt, n) == 0);

  /* The one-shot decryptor reads the streamed ciphertext. */
  uint8_t *pt2;
  size_t pt2_len;
  cr_assert_eq(open_(d, "obj", ct, ct_len, &pt2, &pt2_len), LT_OK, "%s", err);
  cr_assert(pt2_len == n && memcmp(pt2, p, n) == 0);

  /* Reset reuses the stream for a new object with a fresh salt. */
  cr_assert_eq(lt_crypto_stream_reset(enc, "obj2", err, sizeof err), LT_OK);
  cr_assert_eq(lt_crypto_stream_final(enc, tmp, lt_crypto_stream_out_max(enc, 0), &o, err,
                                      sizeof err), LT_OK, "%s", err);
  cr_assert_eq(o, lt_crypto_sealed_size(d, 0, chunk));
  cr_assert(memcmp(tmp + 12, ct + 12, 32) != 0, "two objects share a salt");
  free(p); free(pt); free(pt2); free(ct); free(tmp);
  lt_crypto_stream_destroy(enc);
  lt_crypto_stream_destroy(dec);
  lt_crypto_dek_destroy(d);
}

/* Layout helpers for a 4-chunk object with chunk size C and a 2-byte key id "k1". */
#define C 64
#define HDR (44 + 2)
#define FULL (C + 16)

struct fixture {
  lt_crypto_dek_t *d;
  uint8_t *p, *ct;
  size_t n, ct_len;
};

static struct fixture make(size_t n, const char *key, unsigned seed) {
  struct fixture f;
  f.d = dek_raw("t1", "k1", 0x33);
  f.n = n;
  f.p = pattern(n, seed);
  f.ct = seal(f.d, key, C, f.p, n, &f.ct_len);
  return f;
}

static void drop(struct fixture *f) {
  free(f->p); free(f->ct);
  lt_crypto_dek_destroy(f->d);
}

static void expect_corrupt(const lt_crypto_dek_t *d, const char *key, const uint8_t *ct,
                           size_t n, const char *what) {
  uint8_t *pt;
  size_t pt_len = 12345;
  lt_err_t e = open_(d, key, ct, n, &pt, &pt_len);
  cr_assert_eq(e, LT_ERR_CORRUPT, "%s: got %s (%s)", what, lt_err_name(e), err);
  cr_assert_eq(pt_len, 12345, "%s: a length was reported for a failed object", what);
  free(pt);
}

Test(crypto, truncated_last_chunk_is_detected) {
  struct fixture f = make(3 * C + 20, "obj", 3); /* chunks: 64, 64, 64, 20 (final) */
  expect_corrupt(f.d, "obj", f.ct, f.ct_len - 1, "last byte cut");
  expect_corrupt(f.d, "obj", f.ct, f.ct_len - 17, "final chunk cut inside");
  expect_corrupt(f.d, "obj", f.ct, HDR + 10, "cut inside the first chunk");
  expect_corrupt(f.d, "obj", f.ct, HDR - 3, "cut inside the header");
  expect_corrupt(f.d, "obj", f.ct, 0, "empty input");
  drop(&f);
}

Test(crypto, dropped_final_chunk_is_detected_as_truncation) {
  struct fixture f = make(3 * C + 20, "obj", 4);
  size_t without_final = HDR + 3 * FULL;
  cr_assert_eq(f.ct_len, without_final + 20 + 16);
  expect_corrupt(f.d, "obj", f.ct, without_final, "final chunk dropped");
  cr_assert(strstr(err, "truncated") != NULL, "message does not say truncated: %s", err);
  expect_corrupt(f.d, "obj", f.ct, HDR + 2 * FULL, "last two chunks dropped");
  cr_assert(strstr(err, "truncated") != NULL, "%s", err);
  drop(&f);

  /* Exact multiple of the chunk size: the last full chunk is the final one. */
  f = make(3 * C, "obj", 5);
  cr_assert_eq(f.ct_len, HDR + 3 * FULL);
  expect_corrupt(f.d, "obj", f.ct, HDR + 2 * FULL, "exact-multiple object cut by a chunk");
  cr_assert(strstr(err, "truncated") != NULL, "%s", err);
  drop(&f);
}

Test(crypto, data_appended_after_the_final_chunk_is_detected) {
  struct fixture f = make(2 * C + 7, "obj", 6);
  uint8_t *ct = malloc(f.ct_len + FULL);
  memcpy(ct, f.ct, f.ct_len);
  memcpy(ct + f.ct_len, f.ct + HDR, FULL); /* a copy of chunk 0 appended */
  expect_corrupt(f.d, "obj", ct, f.ct_len + FULL, "chunk appended");
  memset(ct + f.ct_len, 0, 1);
  expect_corrupt(f.d, "obj", ct, f.ct_len + 1, "one byte appended");
  free(ct);
  drop(&f);
}

Test(crypto, reordered_chunks_are_detected) {
  struct fixture f = make(3 * C + 20, "obj", 7);
  uint8_t tmp[FULL];
  memcpy(tmp, f.ct + HDR + FULL, FULL);
  memcpy(f.ct + HDR + FULL, f.ct + HDR + 2 * FULL, FULL);
  memcpy(f.ct + HDR + 2 * FULL, tmp, FULL);
  expect_corrupt(f.d, "obj", f.ct, f.ct_len, "chunks 1 and 2 swapped");
  cr_assert(strstr(err, "chunk 1") != NULL, "message should name chunk 1: %s", err);
  drop(&f);
}

Test(crypto, chunk_swapped_in_from_another_object_is_detected) {
  struct fixture a = make(3 * C + 20, "obj-a", 8);
  struct fixture b = make(3 * C + 20, "obj-a", 8); /* same key, plaintext, name; other salt */
  uint8_t *x = malloc(a.ct_len);
  if (!x) abort(); /* and GCC's -Warray-bounds under ASan stops seeing a NULL path */
  memcpy(x, a.ct, a.ct_len);
  memcpy(x + HDR + FULL, b.ct + HDR + FULL, FULL);
  expect_corrupt(a.d, "obj-a", x, a.ct_len, "chunk 1 from another object");
  memcpy(x, a.ct, a.ct_len);
  memcpy(x, b.ct, HDR);
  expect_corrupt(a.d, "obj-a", x, a.ct_len, "header from another object");
  free(x);
  drop(&a);
  drop(&b);
}

Test(crypto, ciphertext_under_another_object_key_or_tenant_is_refused) {
  struct fixture f = make(2 * C + 3, "tenants/t1/artifacts/j1/adapter", 9);
  expect_corrupt(f.d, "tenants/t1/artifacts/j2/adapter", f.ct, f.ct_len, "renamed object");
  /* Same raw key and key id, other tenant: the tenant id is in the associated data. */
  lt_crypto_dek_t *other = dek_raw("t2", "k1", 0x33);
  expect_corrupt(other, "tenants/t1/artifacts/j1/adapter", f.ct, f.ct_len, "other tenant");
  cr_assert(strstr(err, "t2") != NULL, "message should name the tenant: %s", err);
  lt_crypto_dek_destroy(other);
  drop(&f);
}

Test(crypto, every_flipped_bit_in_header_body_and_tag_is_detected) {
  struct fixture f = make(2 * C + 9, "obj", 10);
  for (size_t i = 0; i < f.ct_len; i++) {
    for (int bit = 0; bit < 8; bit += 3) {
      f.ct[i] ^= (uint8_t)(1u << bit);
      uint8_t *pt;
      size_t pt_len;
      lt_err_t e = open_(f.d, "obj", f.ct, f.ct_len, &pt, &pt_len);
      free(pt);
      f.ct[i] ^= (uint8_t)(1u << bit);
      if (i == 4 || i == 5)
        cr_assert_eq(e, LT_ERR_UNSUPPORTED, "byte %zu (version/alg): %s", i, lt_err_name(e));
      else if (i == 6 || (i >= 44 && i < HDR)) /* key id or its length: names another key */
        cr_assert(e == LT_ERR_INVALID || e == LT_ERR_CORRUPT, "byte %zu (key id): %s", i,
                  lt_err_name(e));
      else
        cr_assert_eq(e, LT_ERR_CORRUPT, "flipped bit %d of byte %zu went unnoticed (%s)", bit, i,
                     lt_err_name(e));
    }
  }
  drop(&f);
}

Test(crypto, wrong_data_key_is_refused) {
  struct fixture f = make(C + 1, "obj", 11);
  lt_crypto_dek_t *same_id = dek_raw("t1", "k1", 0x34);
  expect_corrupt(same_id, "obj", f.ct, f.ct_len, "other key bytes, same id");
  lt_crypto_dek_t *other_id = dek_raw("t1", "k2", 0x33);
  uint8_t *pt;
  size_t pt_len;
  cr_assert_eq(open_(other_id, "obj", f.ct, f.ct_len, &pt, &pt_len), LT_ERR_INVALID);
  cr_assert(strstr(err, "'k1'") && strstr(err, "'k2'"), "message names both ids: %s", err);
  free(pt);
  char kid[LT_CRYPTO_ID_MAX + 1];
  cr_assert_eq(lt_crypto_peek_key_id(f.ct, f.ct_len, kid, sizeof kid, err, sizeof err), LT_OK);
  cr_assert_str_eq(kid, "k1");
  lt_crypto_dek_destroy(same_id);
  lt_crypto_dek_destroy(other_id);
  drop(&f);
}

/* Found by tests/fuzz/fuzz_crypto: a key id with a NUL byte came out shorter than the header
 * said (here, as ""), naming another key. */
Test(crypto, peeked_key_id_with_a_nul_byte_is_refused) {
  struct fixture f = make(C, "obj", 13);
  char kid[LT_CRYPTO_ID_MAX + 1];
  f.ct[HDR - 2] = 0; /* "k1" -> "\0" "1" */
  cr_assert_eq(lt_crypto_peek_key_id(f.ct, f.ct_len, kid, sizeof kid, err, sizeof err), LT_ERR_CORRUPT);
  cr_assert(strstr(err, "NUL"), "%s", err);
  drop(&f);
}

Test(crypto, plaintext_of_a_bad_chunk_is_never_released) {
  struct fixture f = make(4 * C, "obj", 12);
  f.ct[HDR + 3] ^= 1; /* chunk 0 body */
  lt_crypto_stream_t *s;
  cr_assert_eq(lt_crypto_dec_new(&s, f.d, "obj", err, sizeof err), LT_OK);
  uint8_t *out = malloc(f.ct_len);
  size_t o = 99;
  cr_assert_eq(lt_crypto_stream_update(s, f.ct, f.ct_len, out, f.ct_len, &o, err, sizeof err),
               LT_ERR_CORRUPT);
  cr_assert_eq(o, 0);
  cr_assert_eq(lt_crypto_stream_final(s, out, f.ct_len, &o, err, sizeof err), LT_ERR_INVALID,
               "a failed stream must stay failed");
  free(out);
  lt_crypto_stream_destroy(s);
  drop(&f);
}

/* ---- envelope ---------------------------------------------------------------------------- */

static lt_crypto_kek_t *kek(const char *id, const char *hex) {
  lt_crypto_kek_t *k = NULL;
  cr_assert_eq(lt_crypto_kek_from_text(&k, id, hex, err, sizeof err), LT_OK, "%s", err);
  return k;
}
#define HEX_A "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define HEX_B "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

Test(crypto, wrapped_data_key_unwraps_only_with_its_master_key_and_tenant) {
  lt_crypto_kek_t *ka = kek("m1", HEX_A), *kb_same_id = kek("m1", HEX_B), *kb = kek("m2", HEX_A);
  lt_crypto_dek_t *d;
  cr_assert_eq(lt_crypto_dek_generate(&d, "tenant-a", "dek-7", err, sizeof err), LT_OK);
  uint8_t blob[LT_CRYPTO_WRAPPED_MAX];
  size_t bl;
  cr_assert_eq(lt_crypto_dek_wrap(ka, d, blob, sizeof blob, &bl, err, sizeof err), LT_OK, "%s",
               err);

  lt_crypto_dek_t *u = NULL;
  cr_assert_eq(lt_crypto_dek_unwrap(ka, "tenant-a", blob, bl, &u, err, sizeof err), LT_OK, "%s",
               err);
  cr_assert_str_eq(lt_crypto_dek_key_id(u), "dek-7");
  cr_assert_str_eq(lt_crypto_dek_tenant(u), "tenant-a");
  /* The unwrapped key decrypts what the original encrypted. */
  size_t ct_len, pt_len;
  uint8_t *ct = seal(d, "x", 0, (const uint8_t *)"hello", 5, &ct_len), *pt;
  cr_assert_eq(open_(u, "x", ct, ct_len, &pt, &pt_len), LT_OK, "%s", err);
  cr_assert(pt_len == 5 && memcmp(pt, "hello", 5) == 0);
  free(ct); free(pt);
  lt_crypto_dek_destroy(u);

  u = NULL;
  cr_assert_eq(lt_crypto_dek_unwrap(kb_same_id, "tenant-a", blob, bl, &u, err, sizeof err),
               LT_ERR_CORRUPT, "wrong master key bytes");
  cr_assert_null(u);
  cr_assert(strstr(err, "wrong master key") != NULL, "%s", err);
  cr_assert_eq(lt_crypto_dek_unwrap(kb, "tenant-a", blob, bl, &u, err, sizeof err),
               LT_ERR_CORRUPT, "wrong master key id");
  cr_assert(strstr(err, "'m1'") && strstr(err, "'m2'"), "%s", err);
  cr_assert_eq(lt_crypto_dek_unwrap(ka, "tenant-b", blob, bl, &u, err, sizeof err),
               LT_ERR_CORRUPT, "wrong tenant");
  for (size_t i = 0; i < bl; i++) {
    blob[i] ^= 0x40;
    lt_err_t e = lt_crypto_dek_unwrap(ka, "tenant-a", blob, bl, &u, err, sizeof err);
    blob[i] ^= 0x40;
    cr_assert_neq(e, LT_OK, "flipped byte %zu of the wrapped key went unnoticed", i);
  }
  cr_assert_eq(lt_crypto_dek_unwrap(ka, "tenant-a", blob, bl - 1, &u, err, sizeof err),
               LT_ERR_CORRUPT);
  lt_crypto_dek_destroy(d);
  lt_crypto_kek_destroy(ka); lt_crypto_kek_destroy(kb); lt_crypto_kek_destroy(kb_same_id);
}

Test(crypto, master_key_is_read_from_hex_base64_file_and_env) {
  lt_crypto_kek_t *a = kek("m", HEX_A), *b = NULL;
  /* base64 of bytes 00..1f */
  cr_assert_eq(lt_crypto_kek_from_text(&b, "m", " AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n",
                                       err, sizeof err), LT_OK, "%s", err);
  /* Same key: a DEK wrapped by one unwraps with the other. */
  lt_crypto_dek_t *d, *u;
  cr_assert_eq(lt_crypto_dek_generate(&d, "t", "k", err, sizeof err), LT_OK);
  uint8_t blob[LT_CRYPTO_WRAPPED_MAX];
  size_t bl;
  cr_assert_eq(lt_crypto_dek_wrap(a, d, blob, sizeof blob, &bl, err, sizeof err), LT_OK);
  cr_assert_eq(lt_crypto_dek_unwrap(b, "t", blob, bl, &u, err, sizeof err), LT_OK, "%s", err);
  lt_crypto_dek_destroy(u);
  lt_crypto_kek_destroy(b);

  cr_assert_eq(lt_crypto_kek_from_text(&b, "m", "abc", err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "64 hex") != NULL, "%s", err);
  cr_assert_eq(lt_crypto_kek_from_text(&b, "m", HEX_A "0", err, sizeof err), LT_ERR_INVALID);
  cr_assert_eq(lt_crypto_kek_from_text(&b, "m", "zz0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                                        err, sizeof err), LT_ERR_INVALID);
  cr_assert_eq(lt_crypto_kek_from_text(&b, "", HEX_A, err, sizeof err), LT_ERR_INVALID);

  char path[] = "/tmp/lt-kek-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, HEX_A "\n", 65), 65);
  close(fd);
  chmod(path, 0644);
  cr_assert_eq(lt_crypto_kek_from_file(&b, "m", path, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "chmod 600") != NULL, "%s", err);
  chmod(path, 0600);
  setenv("LATHE_MASTER_KEY_FILE", path, 1);
  setenv("LATHE_MASTER_KEY_ID", "env-key", 1);
  cr_assert_eq(lt_crypto_kek_from_env(&b, err, sizeof err), LT_OK, "%s", err);
  cr_assert_str_eq(lt_crypto_kek_id(b), "env-key");
  cr_assert_eq(lt_crypto_dek_unwrap(b, "t", blob, bl, &u, err, sizeof err), LT_ERR_CORRUPT,
               "the id is part of the binding");
  lt_crypto_kek_destroy(b);
  unlink(path);
  unsetenv("LATHE_MASTER_KEY_FILE");
  unsetenv("LATHE_MASTER_KEY");
  cr_assert_eq(lt_crypto_kek_from_env(&b, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "LATHE_MASTER_KEY") != NULL, "%s", err);
  setenv("LATHE_MASTER_KEY", "not-a-key", 1);
  cr_assert_eq(lt_crypto_kek_from_env(&b, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "LATHE_MASTER_KEY:") != NULL, "%s", err);
  unsetenv("LATHE_MASTER_KEY");
  unsetenv("LATHE_MASTER_KEY_ID");
  lt_crypto_dek_destroy(d);
  lt_crypto_kek_destroy(a);
}

/* ---- primitives and helpers ----------------------------------------------------------------- */

static void unhex(const char *h, uint8_t *out, size_t n) {
  cr_assert_eq(lt_crypto_unhex(h, out, n, err, sizeof err), LT_OK, "%s", err);
}

/* McGrew & Viega, "The Galois/Counter Mode of Operation", test case 16 (AES-256, 96-bit IV,
 * 60-byte plaintext, 20-byte AAD), the vector NIST's GCM validation reuses. */
Test(crypto, aes_256_gcm_known_answer_through_evp) {
  uint8_t key[32], iv[12], aad[20], pt[60], ct_exp[60], tag_exp[16], ct[60], tag[16];
  unhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", key, 32);
  unhex("cafebabefacedbaddecaf888", iv, 12);
  unhex("feedfacedeadbeeffeedfacedeadbeefabaddad2", aad, 20);
  unhex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
        "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39", pt, 60);
  unhex("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
        "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662", ct_exp, 60);
  unhex("76fc6ece0f4e1768cddf8853bb2d551b", tag_exp, 16);
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  int n;
  cr_assert_eq(EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv), 1);
  cr_assert_eq(EVP_EncryptUpdate(c, NULL, &n, aad, sizeof aad), 1);
  cr_assert_eq(EVP_EncryptUpdate(c, ct, &n, pt, sizeof pt), 1);
  cr_assert_eq(EVP_EncryptFinal_ex(c, ct + n, &n), 1);
  cr_assert_eq(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag), 1);
  EVP_CIPHER_CTX_free(c);
  cr_assert(memcmp(ct, ct_exp, 60) == 0, "ciphertext differs from the test vector");
  cr_assert(memcmp(tag, tag_exp, 16) == 0, "tag differs from the test vector");
}

Test(crypto, sha256_matches_fips_180_vectors_streaming_and_one_shot) {
  uint8_t d[32], e[32];
  char hex[65];
  lt_crypto_sha256("abc", 3, d);
  cr_assert_str_eq(lt_crypto_hex(d, 32, hex),
                   "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  lt_crypto_sha256("", 0, d);
  cr_assert_str_eq(lt_crypto_hex(d, 32, hex),
                   "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  lt_crypto_sha256_t *h;
  cr_assert_eq(lt_crypto_sha256_new(&h), LT_OK);
  for (size_t i = 0; i < strlen(m); i += 5)
    lt_crypto_sha256_update(h, m + i, strlen(m) - i < 5 ? strlen(m) - i : 5);
  lt_crypto_sha256_final(h, e);
  cr_assert_str_eq(lt_crypto_hex(e, 32, hex),
                   "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  lt_crypto_sha256_reset(h);
  lt_crypto_sha256_update(h, "abc", 3);
  lt_crypto_sha256_final(h, e);
  lt_crypto_sha256("abc", 3, d);
  cr_assert(lt_crypto_ct_equal(d, e, 32), "reset did not restart the hash");
  lt_crypto_sha256_destroy(h);
}

Test(crypto, hex_constant_time_compare_and_random_ids) {
  uint8_t b[4];
  cr_assert_eq(lt_crypto_unhex("00fFa5", b, 3, err, sizeof err), LT_OK);
  cr_assert(b[0] == 0 && b[1] == 0xff && b[2] == 0xa5);
  cr_assert_eq(lt_crypto_unhex("00fg", b, 2, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "offset 3") != NULL, "%s", err);
  cr_assert_eq(lt_crypto_unhex("00f", b, 2, err, sizeof err), LT_ERR_INVALID);
  cr_assert(lt_crypto_ct_equal("abcd", "abcd", 4));
  cr_assert(!lt_crypto_ct_equal("abcd", "abce", 4));
  char ids[64][LT_CRYPTO_RANDOM_ID_CHARS + 1];
  for (int i = 0; i < 64; i++) {
    cr_assert_eq(lt_crypto_random_id(ids[i]), LT_OK);
    cr_assert_eq(strlen(ids[i]), 32);
    cr_assert_eq(strspn(ids[i], "0123456789abcdef"), 32);
    for (int j = 0; j < i; j++) cr_assert_str_neq(ids[i], ids[j]);
  }
}

/* A derived data key depends on its parent and label only: the same inputs give the same key in any
 * process (two publishers making one job's key agree), other labels or parents another one. */
Test(crypto, derived_data_key_is_a_function_of_parent_and_label) {
  uint8_t raw[LT_CRYPTO_KEY_BYTES], a[LT_CRYPTO_KEY_BYTES], b[LT_CRYPTO_KEY_BYTES], c[LT_CRYPTO_KEY_BYTES],
      d[LT_CRYPTO_KEY_BYTES], p[LT_CRYPTO_KEY_BYTES];
  memset(raw, 0x5a, sizeof raw);
  lt_crypto_dek_t *parent, *parent2, *other, *k1, *k2, *k3, *k4;
  cr_assert_eq(lt_crypto_dek_import(&parent, "tenant-a", "dek-1", raw, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dek_import(&parent2, "tenant-a", "dek-1", raw, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dek_generate(&other, "tenant-a", "dek-1", err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dek_derive(parent, "artifact\njob-1", "job-1", &k1, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dek_derive(parent2, "artifact\njob-1", "job-1", &k2, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dek_derive(parent, "artifact\njob-2", "job-1", &k3, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dek_derive(other, "artifact\njob-1", "job-1", &k4, err, sizeof err), LT_OK, "%s", err);
  lt_crypto_dek_export(k1, a);
  lt_crypto_dek_export(k2, b);
  lt_crypto_dek_export(k3, c);
  lt_crypto_dek_export(k4, d);
  lt_crypto_dek_export(parent, p);
  cr_assert(memcmp(a, b, sizeof a) == 0, "one parent and label gave two keys");
  cr_assert(memcmp(a, c, sizeof a) != 0, "another label gave the same key");
  cr_assert(memcmp(a, d, sizeof a) != 0, "another parent gave the same key");
  cr_assert(memcmp(a, p, sizeof a) != 0, "the derived key is the parent's");
  cr_assert_str_eq(lt_crypto_dek_tenant(k1), "tenant-a");
  cr_assert_str_eq(lt_crypto_dek_key_id(k1), "job-1");
  /* What one sealed the other opens. */
  uint8_t sealed[256], out[256];
  size_t slen, olen;
  cr_assert_eq(lt_crypto_seal(k1, "o", 0, "hello", 5, sealed, sizeof sealed, &slen, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_open(k2, "o", sealed, slen, out, sizeof out, &olen, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(olen, 5);
  cr_assert_eq(lt_crypto_dek_derive(parent, "", "job-1", &k3, err, sizeof err), LT_ERR_INVALID);
  cr_assert_eq(lt_crypto_dek_derive(parent, "x", "", &k3, err, sizeof err), LT_ERR_INVALID);
  lt_crypto_dek_t *ds[] = {parent, parent2, other, k1, k2, k3, k4};
  for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) lt_crypto_dek_destroy(ds[i]);
}
