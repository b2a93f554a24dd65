/* bench_crypto: encryption throughput of the LTE1 chunked stream (64 KiB chunks, streamed in
 * 1 MiB pieces as an upload would be) against raw EVP AES-256-GCM over the same buffer in one
 * call, in the same run. Also reports decryption. Last line: `crypto_stream_vs_raw_gcm: ratio`.
 * Usage: bench_crypto [MiB, default 256] */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "lt_crypto.h"

static char err[256];

static double raw_gcm(const uint8_t *in, size_t n, uint8_t *out) {
  uint8_t key[32] = {1}, iv[12] = {2}, tag[16];
  int l;
  double t0 = bench_now_s();
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv);
  for (size_t off = 0; off < n;) { /* EVP lengths are int: 1 GiB steps */
    size_t take = n - off < (1u << 30) ? n - off : (1u << 30);
    EVP_EncryptUpdate(c, out + off, &l, in + off, (int)take);
    off += take;
  }
  EVP_EncryptFinal_ex(c, out + n, &l);
  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag);
  EVP_CIPHER_CTX_free(c);
  return bench_now_s() - t0;
}

static double stream(lt_crypto_stream_t *s, const uint8_t *in, size_t n, uint8_t *out,
                     size_t *out_len, size_t piece) {
  size_t pos = 0, o;
  double t0 = bench_now_s();
  for (size_t off = 0; off < n; off += piece) {
    size_t take = piece < n - off ? piece : n - off;
    if (lt_crypto_stream_update(s, in + off, take, out + pos, lt_crypto_stream_out_max(s, take),
                                &o, err, sizeof err)) {
      fprintf(stderr, "update: %s\n", err);
      exit(1);
    }
    pos += o;
  }
  if (lt_crypto_stream_final(s, out + pos, lt_crypto_stream_out_max(s, 0), &o, err, sizeof err)) {
    fprintf(stderr, "final: %s\n", err);
    exit(1);
  }
  *out_len = pos + o;
  return bench_now_s() - t0;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256, n = mib << 20, piece = 1 << 20;
  uint8_t *in = malloc(n), *raw = malloc(n + 16), *ct, *pt;
  lt_crypto_dek_t *dek;
  if (!in || !raw || lt_crypto_dek_generate(&dek, "bench", "k1", err, sizeof err)) return 1;
  size_t ct_cap = lt_crypto_sealed_size(dek, n, 0) + 2 * piece;
  ct = malloc(ct_cap);
  pt = malloc(n + 2 * piece);
  for (size_t i = 0; i < n; i++) in[i] = (uint8_t)(i * 131 + (i >> 12));
  memset(raw, 0, n + 16);
  memset(ct, 0, ct_cap);
  memset(pt, 0, n + 2 * piece);

  lt_crypto_stream_t *enc, *dec;
  lt_crypto_enc_new(&enc, dek, "tenants/bench/datasets/d/data", 0, err, sizeof err);
  lt_crypto_dec_new(&dec, dek, "tenants/bench/datasets/d/data", err, sizeof err);
  double best_raw = 1e9, best_enc = 1e9, best_dec = 1e9;
  size_t ct_len = 0, pt_len = 0;
  for (int rep = 0; rep < 5; rep++) { /* interleaved, best of 5: the machine is shared */
    double t = raw_gcm(in, n, raw);
    if (t < best_raw) best_raw = t;
    lt_crypto_stream_reset(enc, "tenants/bench/datasets/d/data", err, sizeof err);
    t = stream(enc, in, n, ct, &ct_len, piece);
    if (t < best_enc) best_enc = t;
    lt_crypto_stream_reset(dec, "tenants/bench/datasets/d/data", err, sizeof err);
    t = stream(dec, ct, ct_len, pt, &pt_len, piece);
    if (t < best_dec) best_dec = t;
  }
  if (pt_len != n || memcmp(pt, in, n) != 0) {
    fprintf(stderr, "round trip failed\n");
    return 1;
  }
  double mb = (double)n / 1e6;
  printf("size: %zu MiB, chunk %u KiB, pieces of %zu KiB, best of 5\n", mib,
         LT_CRYPTO_CHUNK_DEFAULT / 1024, piece / 1024);
  printf("raw EVP AES-256-GCM, one buffer: %.0f MB/s\n", mb / best_raw);
  printf("LTE1 stream encrypt:            %.0f MB/s\n", mb / best_enc);
  printf("LTE1 stream decrypt+verify:     %.0f MB/s\n", mb / best_dec);
  printf("crypto_decrypt_vs_raw_gcm: %.3f\n", best_raw / best_dec);
  printf("crypto_stream_vs_raw_gcm: %.3f\n", best_raw / best_enc);
  lt_crypto_stream_destroy(enc);
  lt_crypto_stream_destroy(dec);
  lt_crypto_dek_destroy(dek);
  free(in); free(raw); free(ct); free(pt);
  return 0;
}
