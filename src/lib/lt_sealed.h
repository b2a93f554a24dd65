/* lt_sealed: customer data at rest = an LTE1 stream (lt_crypto) in the object store (lt_store).
 *
 * The one place where encryption meets storage, so no caller can store customer bytes in the
 * clear by accident (docs/DESIGN.md §4.7): datasets, checkpoints and artifacts are written through a
 * sealed writer and read back through lt_sealed_get, which verifies every chunk before any
 * plaintext is returned. The object key is bound into the ciphertext, so an object copied to
 * another key or tenant does not decrypt.
 *
 * Also the keyring: a tenant's data key unwrapped from its TenantUpserted record with the master
 * key, cached per tenant. Thread safety: a writer belongs to one thread; a keyring too. */
#ifndef LT_SEALED_H
#define LT_SEALED_H

#include <stddef.h>
#include <stdint.h>

#include "lt_crypto.h"
#include "lt_err.h"
#include "lt_store.h"
#include "lt_tenant.h"

typedef struct lt_sealed_writer lt_sealed_writer_t;

/* Starts an encrypted object at key. dek must outlive the writer. */
lt_err_t lt_sealed_writer_new(lt_store_t *store, const lt_crypto_dek_t *dek, const char *key,
                              lt_sealed_writer_t **out, char *errstr, size_t errstr_size);
/* Also feeds every stored (encrypted) byte into h (borrowed, may be shared by several writers in
 * turn): a checkpoint's SHA-256 covers its objects' stored bytes in order. */
void lt_sealed_writer_hash(lt_sealed_writer_t *w, lt_crypto_sha256_t *h);
lt_err_t lt_sealed_writer_write(lt_sealed_writer_t *w, const void *data, size_t len, char *errstr,
                                size_t errstr_size);
/* Between bursts of writes: hands the store what it can take now and releases the writer's
 * buffers (lt_store_writer_flush), so that an idle writer holds less than one store part. */
lt_err_t lt_sealed_writer_flush(lt_sealed_writer_t *w, char *errstr, size_t errstr_size);
/* Finishes and makes the object visible; sha256 (may be NULL) of the stored (encrypted) bytes,
 * *plain_bytes and *stored_bytes (each may be NULL) the sizes of the plaintext and of the stored
 * object. Frees the writer, also on failure. */
lt_err_t lt_sealed_writer_commit(lt_sealed_writer_t *w, uint8_t sha256[32], uint64_t *plain_bytes,
                                 uint64_t *stored_bytes, char *errstr, size_t errstr_size);
/* Drops everything written; nothing stays in the store. Frees. NULL is fine. */
void lt_sealed_writer_abort(lt_sealed_writer_t *w);

/* One-shot put of a buffer. */
lt_err_t lt_sealed_put(lt_store_t *store, const lt_crypto_dek_t *dek, const char *key, const void *data,
                       size_t len, uint8_t sha256[32], char *errstr, size_t errstr_size);

/* Reads and decrypts a whole object (at most max_len stored bytes) into a malloc'd buffer the
 * caller frees (and should scrub). LT_ERR_CORRUPT when any chunk fails to verify. */
lt_err_t lt_sealed_get(lt_store_t *store, const lt_crypto_dek_t *dek, const char *key, size_t max_len,
                       void **data, size_t *len, char *errstr, size_t errstr_size);

/* ---- keyring ---- */
typedef struct lt_keyring lt_keyring_t;

/* kek and tenants are borrowed and must outlive the keyring. */
lt_err_t lt_keyring_new(const lt_crypto_kek_t *kek, lt_keyring_t **out);
void lt_keyring_destroy(lt_keyring_t *kr);
/* The tenant's data key (borrowed, valid while the keyring lives), unwrapped on first use.
 * LT_ERR_NOT_FOUND without a wrapped key; LT_ERR_CORRUPT when it does not unwrap. */
lt_err_t lt_keyring_tenant_dek(lt_keyring_t *kr, const lt_tenant_t *tenant, const lt_crypto_dek_t **out,
                               char *errstr, size_t errstr_size);

#endif
