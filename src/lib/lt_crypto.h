/* lt_crypto: envelope encryption of customer data at rest (docs/DESIGN.md §4 invariant 7), plus the
 * small hashing, encoding and randomness helpers the rest of Lathe uses.
 *
 * Keys. A master key (KEK, lt_crypto_kek_t) comes from configuration (LATHE_MASTER_KEY,
 * LATHE_MASTER_KEY_FILE; never from library code) and wraps one 256-bit data key (DEK,
 * lt_crypto_dek_t) per tenant with AES-256-GCM. The wrapped blob binds the tenant id and the
 * DEK's key id through the associated data, so a blob unwraps only for its tenant and only with
 * its master key. The wrapped blob is what lathe.tenants stores; raw DEKs never leave memory.
 *
 * Objects. Every object at rest is one "LTE1" stream:
 *
 *   header  "LTE1" | version 1 | alg 1 | key id length | 0 | chunk size (u32 BE) |
 *           salt (32 random bytes) | key id
 *   chunks  ciphertext (chunk size bytes, the last one 0..chunk size) | GCM tag (16)
 *
 * Each object gets its own AES-256-GCM key and 8-byte nonce prefix from HKDF-SHA256(DEK, salt),
 * so nonces never repeat across objects under one DEK; chunk i uses nonce prefix || BE32(i).
 * Each chunk's associated data is SHA-256(header, tenant id, object key) || BE32(i) || final
 * flag: truncation, dropped or reordered chunks, chunks swapped between objects or tenants,
 * an object renamed to another key and any flipped byte all fail with LT_ERR_CORRUPT. A chunk's
 * plaintext is released only after its tag verified.
 *
 * Threads: the helpers are thread-safe. A kek or dek may be shared read-only by many threads.
 * A stream belongs to one thread at a time. Every free function zeroes key material and accepts
 * NULL. */
#ifndef LT_CRYPTO_H
#define LT_CRYPTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

#define LT_CRYPTO_KEY_BYTES 32        /* AES-256 */
#define LT_CRYPTO_SHA256_BYTES 32
#define LT_CRYPTO_ID_MAX 64           /* longest key id / master key id, bytes */
#define LT_CRYPTO_TENANT_MAX 128      /* longest tenant id, bytes */
#define LT_CRYPTO_OBJECT_KEY_MAX 1024 /* longest object key, bytes (S3's limit) */
#define LT_CRYPTO_CHUNK_DEFAULT (64u * 1024u)
#define LT_CRYPTO_CHUNK_MAX (16u * 1024u * 1024u)
#define LT_CRYPTO_TAG_BYTES 16
#define LT_CRYPTO_HEADER_MAX (44 + LT_CRYPTO_ID_MAX)
#define LT_CRYPTO_WRAPPED_MAX (20 + 2 * LT_CRYPTO_ID_MAX + 32 + 16)
#define LT_CRYPTO_RANDOM_ID_CHARS 32  /* lt_crypto_random_id writes 32 hex chars + NUL */

/* ---- master key (KEK) ---------------------------------------------------------------------- */

typedef struct lt_crypto_kek lt_crypto_kek_t;

/* Builds a master key from text: 64 hex characters or 44 base64 characters (32 bytes),
 * surrounding whitespace ignored. `id` (1..64 bytes) names the key in wrapped blobs so a
 * rotation can tell which master key wrapped what. */
lt_err_t lt_crypto_kek_from_text(lt_crypto_kek_t **out, const char *id, const char *text,
                                 char *errstr, size_t errstr_size);

/* Reads the master key text from a file that must not be readable by group or others (0600). */
lt_err_t lt_crypto_kek_from_file(lt_crypto_kek_t **out, const char *id, const char *path,
                                 char *errstr, size_t errstr_size);

/* From the environment: LATHE_MASTER_KEY_FILE (preferred) or LATHE_MASTER_KEY (text), and
 * LATHE_MASTER_KEY_ID (default "master-1"). LT_ERR_INVALID naming the variable when neither is
 * set or the value is malformed. */
lt_err_t lt_crypto_kek_from_env(lt_crypto_kek_t **out, char *errstr, size_t errstr_size);

const char *lt_crypto_kek_id(const lt_crypto_kek_t *kek);
void lt_crypto_kek_destroy(lt_crypto_kek_t *kek);

/* A key for another purpose, derived from the master key: HKDF-SHA256(master, info = label), len
 * bytes (1..64). Distinct labels give independent keys; the master key itself never leaves. */
lt_err_t lt_crypto_kek_derive(const lt_crypto_kek_t *kek, const char *label, uint8_t *out, size_t len,
                              char *errstr, size_t errstr_size);

/* ---- data key (DEK) ------------------------------------------------------------------------ */

typedef struct lt_crypto_dek lt_crypto_dek_t;

/* A fresh random DEK (RAND_bytes) for `tenant`, named `key_id` (1..64 bytes). */
lt_err_t lt_crypto_dek_generate(lt_crypto_dek_t **out, const char *tenant, const char *key_id,
                                char *errstr, size_t errstr_size);

/* A DEK from raw bytes. For tests and key migration only: production DEKs come from
 * lt_crypto_dek_generate or lt_crypto_dek_unwrap. */
lt_err_t lt_crypto_dek_import(lt_crypto_dek_t **out, const char *tenant, const char *key_id,
                              const uint8_t key[LT_CRYPTO_KEY_BYTES], char *errstr,
                              size_t errstr_size);

/* A DEK derived from another: HKDF-SHA256(parent, info = label), for parent's tenant, named
 * key_id. The same parent and label always give the same key, so two processes that make "the"
 * key of one thing at once make the same one (the publisher's artifact keys). */
lt_err_t lt_crypto_dek_derive(const lt_crypto_dek_t *parent, const char *label, const char *key_id,
                              lt_crypto_dek_t **out, char *errstr, size_t errstr_size);

/* Wraps `dek` under `kek` into out (capacity LT_CRYPTO_WRAPPED_MAX is always enough); the blob
 * binds dek's tenant and key id. *out_len receives the blob length. */
lt_err_t lt_crypto_dek_wrap(const lt_crypto_kek_t *kek, const lt_crypto_dek_t *dek, uint8_t *out,
                            size_t out_cap, size_t *out_len, char *errstr, size_t errstr_size);

/* Unwraps a blob for `tenant`. LT_ERR_CORRUPT with a message naming the cause when the blob was
 * wrapped by another master key (by id), for another tenant, or was altered. */
lt_err_t lt_crypto_dek_unwrap(const lt_crypto_kek_t *kek, const char *tenant, const uint8_t *blob,
                              size_t blob_len, lt_crypto_dek_t **out, char *errstr,
                              size_t errstr_size);

/* The raw key bytes, for handing one job's key to its confined executor over a pipe
 * (workers/lt_worker.c); the caller cleanses out after use. */
void lt_crypto_dek_export(const lt_crypto_dek_t *dek, uint8_t out[LT_CRYPTO_KEY_BYTES]);

const char *lt_crypto_dek_tenant(const lt_crypto_dek_t *dek);
const char *lt_crypto_dek_key_id(const lt_crypto_dek_t *dek);
void lt_crypto_dek_destroy(lt_crypto_dek_t *dek);

/* ---- LTE1 streams -------------------------------------------------------------------------- */

typedef struct lt_crypto_stream lt_crypto_stream_t;

/* An encrypting stream of object `object_key` under `dek` (the stream keeps a reference: dek
 * must outlive it). chunk_size 0 means LT_CRYPTO_CHUNK_DEFAULT; at most LT_CRYPTO_CHUNK_MAX.
 * The header comes out with the first update or final. */
lt_err_t lt_crypto_enc_new(lt_crypto_stream_t **out, const lt_crypto_dek_t *dek,
                           const char *object_key, size_t chunk_size, char *errstr,
                           size_t errstr_size);

/* A decrypting stream for object `object_key` of dek's tenant. The header's key id must be
 * dek's (else LT_ERR_INVALID naming both; use lt_crypto_peek_key_id to pick the DEK). */
lt_err_t lt_crypto_dec_new(lt_crypto_stream_t **out, const lt_crypto_dek_t *dek,
                           const char *object_key, char *errstr, size_t errstr_size);

/* Restarts a stream for another object with the same key and direction, reusing its buffers
 * (an encrypting stream draws a new salt). */
lt_err_t lt_crypto_stream_reset(lt_crypto_stream_t *s, const char *object_key, char *errstr,
                                size_t errstr_size);

/* Most bytes the next update with in_len input (or final, in_len 0) can write. */
size_t lt_crypto_stream_out_max(const lt_crypto_stream_t *s, size_t in_len);

/* Feeds in_len bytes; writes whole chunks (encrypting) or verified plaintext (decrypting) to
 * out and sets *out_len. out_cap must be >= lt_crypto_stream_out_max(s, in_len). A decrypting
 * stream returns LT_ERR_CORRUPT (or LT_ERR_UNSUPPORTED for an unknown version) as soon as a
 * chunk fails; after any error the stream only accepts reset or free. */
lt_err_t lt_crypto_stream_update(lt_crypto_stream_t *s, const void *in, size_t in_len, void *out,
                                 size_t out_cap, size_t *out_len, char *errstr,
                                 size_t errstr_size);

/* Ends the stream: writes the final chunk (encrypting) or verifies it and writes its plaintext
 * (decrypting). LT_ERR_CORRUPT when the stream was truncated or its final chunk fails. */
lt_err_t lt_crypto_stream_final(lt_crypto_stream_t *s, void *out, size_t out_cap,
                                size_t *out_len, char *errstr, size_t errstr_size);

void lt_crypto_stream_destroy(lt_crypto_stream_t *s);

/* Exact size of the LTE1 stream of a plaintext of plain_len bytes. */
size_t lt_crypto_sealed_size(const lt_crypto_dek_t *dek, size_t plain_len, size_t chunk_size);

/* One-shot encryption of a buffer into out (capacity >= lt_crypto_sealed_size). */
lt_err_t lt_crypto_seal(const lt_crypto_dek_t *dek, const char *object_key, size_t chunk_size,
                        const void *in, size_t in_len, void *out, size_t out_cap,
                        size_t *out_len, char *errstr, size_t errstr_size);

/* One-shot decryption; out_cap >= in_len is always enough. */
lt_err_t lt_crypto_open(const lt_crypto_dek_t *dek, const char *object_key, const void *in,
                        size_t in_len, void *out, size_t out_cap, size_t *out_len, char *errstr,
                        size_t errstr_size);

/* Copies the key id of an LTE1 header (first bytes of an object) into key_id (capacity >=
 * LT_CRYPTO_ID_MAX + 1). LT_ERR_CORRUPT if it is not an LTE1 header; LT_ERR_INVALID if too few
 * bytes were given (LT_CRYPTO_HEADER_MAX always suffices). */
lt_err_t lt_crypto_peek_key_id(const void *in, size_t in_len, char *key_id, size_t key_id_size,
                               char *errstr, size_t errstr_size);

/* ---- helpers ------------------------------------------------------------------------------- */

typedef struct lt_crypto_sha256 lt_crypto_sha256_t;

/* Streaming SHA-256: new once, then update*, final, reset to reuse without allocating. */
lt_err_t lt_crypto_sha256_new(lt_crypto_sha256_t **out);
void lt_crypto_sha256_update(lt_crypto_sha256_t *h, const void *data, size_t len);
void lt_crypto_sha256_final(lt_crypto_sha256_t *h, uint8_t out[LT_CRYPTO_SHA256_BYTES]);
void lt_crypto_sha256_reset(lt_crypto_sha256_t *h);
void lt_crypto_sha256_destroy(lt_crypto_sha256_t *h);

/* One-shot SHA-256. */
void lt_crypto_sha256(const void *data, size_t len, uint8_t out[LT_CRYPTO_SHA256_BYTES]);

/* Lower-case hex of len bytes into out (capacity 2*len+1, NUL-terminated). Returns out. */
char *lt_crypto_hex(const uint8_t *in, size_t len, char *out);

/* Parses exactly 2*out_len hex characters. LT_ERR_INVALID naming the offset of a bad char. */
lt_err_t lt_crypto_unhex(const char *hex, uint8_t *out, size_t out_len, char *errstr,
                         size_t errstr_size);

/* Constant-time equality of two n-byte buffers (CRYPTO_memcmp), e.g. API key hashes. */
bool lt_crypto_ct_equal(const void *a, const void *b, size_t n);

/* len bytes from the CSPRNG (RAND_bytes). LT_ERR_INTERNAL if it fails. */
lt_err_t lt_crypto_random(void *out, size_t len);

/* A 128-bit random id as 32 lower-case hex chars + NUL (event ids, job ids). */
lt_err_t lt_crypto_random_id(char out[LT_CRYPTO_RANDOM_ID_CHARS + 1]);

#endif
