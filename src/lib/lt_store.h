/* lt_store: the object store (docs/DESIGN.md §8). Bytes of datasets, checkpoints and artifacts live
 * here, already encrypted by lt_crypto; the store itself neither encrypts nor interprets them.
 *
 * Two backends behind one small vtable:
 *   - S3 through libs3 (signature V2, path-style URIs, plain HTTP to the local server; MinIO or
 *     S3Proxy). Retriable failures (connection errors, 5xx, SlowDown) are retried with
 *     exponential backoff and jitter; objects larger than the part size are uploaded with
 *     multipart upload (aborted on failure, so no half-written object ever appears).
 *   - a local directory for the embedded mode: atomic writes (temp file, fsync, rename, fsync
 *     of the directory); a key maps to a path segment by segment, escaped so that no key can
 *     reach outside the root.
 *
 * Keys: 1..1024 bytes, no control characters (NUL included), no leading '/', no empty, "." or
 * ".." segment, no trailing '/'. Every call checks its keys first (LT_ERR_INVALID naming the key
 * and the rule).
 *
 * Errors: LT_ERR_NOT_FOUND (no such key), LT_ERR_INVALID (bad key or argument), LT_ERR_AUTH
 * (credentials refused), LT_ERR_UNAVAILABLE (store unreachable or failing after the retries:
 * the caller may try again later), LT_ERR_IO (local I/O), LT_ERR_CORRUPT (an answer that makes
 * no sense). lt_store_err_retriable() says which are worth retrying later.
 *
 * Threads: a store handle may be used from many threads at once (each call is independent). A
 * writer belongs to one thread. Content hashes are SHA-256 of the bytes as stored. */
#ifndef LT_STORE_H
#define LT_STORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

#define LT_STORE_KEY_MAX 1024
#define LT_STORE_ETAG_MAX 128
#define LT_STORE_LIST_MAX 1000 /* most keys in one list page */

typedef struct lt_store lt_store_t;
typedef struct lt_store_writer lt_store_writer_t;

typedef struct lt_store_info {
  uint64_t size;                 /* bytes */
  int64_t mtime;                 /* seconds since the epoch, last write */
  char etag[LT_STORE_ETAG_MAX];  /* opaque, changes when the content changes; "" if unknown */
} lt_store_info_t;

/* ---- construction -------------------------------------------------------------------------- */

typedef struct lt_store_s3_conf {
  const char *endpoint;    /* "host:port", no scheme; required */
  const char *bucket;      /* required */
  const char *access_key;  /* required */
  const char *secret_key;  /* required */
  bool https;              /* false for the local server */
  int max_attempts;        /* per request, including the first; 0 = 5 */
  int backoff_ms;          /* first retry delay, doubled each time (cap 5 s); 0 = 100 */
  size_t part_size;        /* multipart part size; 0 = 8 MiB; at least 5 MiB */
} lt_store_s3_conf_t;

/* Fills conf from LATHE_S3_ENDPOINT (an http:// or https:// prefix is accepted), LATHE_S3_BUCKET,
 * LATHE_S3_ACCESS_KEY, LATHE_S3_SECRET_KEY. The strings point into the environment. Other fields
 * are zero (defaults). LT_ERR_INVALID naming the first missing variable. */
lt_err_t lt_store_s3_conf_from_env(lt_store_s3_conf_t *conf, char *errstr, size_t errstr_size);

/* An S3 store. The conf strings are copied. Makes no request (a bad endpoint shows on first
 * use). */
lt_err_t lt_store_s3_new(lt_store_t **out, const lt_store_s3_conf_t *conf, char *errstr,
                         size_t errstr_size);

/* A directory store rooted at `root`, created (mode 0700) if missing. */
lt_err_t lt_store_dir_new(lt_store_t **out, const char *root, char *errstr, size_t errstr_size);

/* Frees the handle (NULL allowed). Writers must be finished first. */
void lt_store_destroy(lt_store_t *s);

/* "s3" or "dir". */
const char *lt_store_kind(const lt_store_t *s);

/* ---- objects ------------------------------------------------------------------------------- */

/* Stores len bytes under key, replacing any object there. sha256 (may be NULL) receives the
 * content hash. The object appears whole or not at all. */
lt_err_t lt_store_put(lt_store_t *s, const char *key, const void *data, size_t len,
                      uint8_t sha256[32], char *errstr, size_t errstr_size);

/* Reads a whole object into a malloc'd buffer (*data, caller frees; a 0-byte object gives a
 * non-NULL buffer). LT_ERR_INVALID naming the limit when it is larger than max_len. */
lt_err_t lt_store_get(lt_store_t *s, const char *key, size_t max_len, void **data, size_t *len,
                      uint8_t sha256[32], char *errstr, size_t errstr_size);

/* Receives consecutive pieces of an object; a non-zero return stops the read and is returned. */
typedef lt_err_t (*lt_store_sink_fn)(void *ctx, const void *data, size_t len);

/* Streams an object to sink in pieces, never holding it whole. On a retried S3 read the stream
 * resumes where it stopped, so the sink sees every byte exactly once. */
lt_err_t lt_store_get_stream(lt_store_t *s, const char *key, lt_store_sink_fn sink, void *ctx,
                             uint8_t sha256[32], char *errstr, size_t errstr_size);

/* Size, mtime and etag of an object; LT_ERR_NOT_FOUND if there is none. */
lt_err_t lt_store_head(lt_store_t *s, const char *key, lt_store_info_t *info, char *errstr,
                       size_t errstr_size);

/* Removes an object. Removing a missing key succeeds (deletes are idempotent). */
lt_err_t lt_store_delete(lt_store_t *s, const char *key, char *errstr, size_t errstr_size);

/* Copies src to dst inside the store, on the server side where the backend can (S3 PUT-copy up
 * to 5 GiB; a hard link in the directory store). LT_ERR_NOT_FOUND if src is missing. */
lt_err_t lt_store_copy(lt_store_t *s, const char *src, const char *dst, char *errstr,
                       size_t errstr_size);

/* Called once per key of a list page, in ascending byte order. */
typedef lt_err_t (*lt_store_list_fn)(void *ctx, const char *key, const lt_store_info_t *info);

/* One page of the keys that start with prefix ("" for all) and sort after start_after (NULL or
 * "" for the first page), at most max_keys (1..LT_STORE_LIST_MAX; 0 means the maximum).
 * next (capacity next_size >= LT_STORE_KEY_MAX + 1) receives the start_after of the next page,
 * or "" when this was the last page. */
lt_err_t lt_store_list(lt_store_t *s, const char *prefix, const char *start_after,
                       size_t max_keys, lt_store_list_fn fn, void *ctx, char *next,
                       size_t next_size, char *errstr, size_t errstr_size);

/* Deletes every object whose key starts with prefix (not ""), page by page; *deleted (may be
 * NULL) counts those deleted. Stops at the first failure and returns it: what was deleted stays
 * deleted, the rest stays listed. */
lt_err_t lt_store_delete_prefix(lt_store_t *s, const char *prefix, uint64_t *deleted, char *errstr,
                                size_t errstr_size);

/* ---- streaming writes ---------------------------------------------------------------------- */

/* Starts a streamed write of key. Memory stays bounded (one multipart part for S3) whatever the
 * object size. Nothing is visible until commit. */
lt_err_t lt_store_writer_new(lt_store_t *s, const char *key, lt_store_writer_t **out,
                             char *errstr, size_t errstr_size);

/* Appends bytes. On error the writer is dead: call abort. */
lt_err_t lt_store_writer_write(lt_store_writer_t *w, const void *data, size_t len, char *errstr,
                               size_t errstr_size);

/* Makes the object visible whole and frees the writer (also on failure, after cleaning up).
 * sha256 (may be NULL) receives the content hash; size (may be NULL) the byte count. */
lt_err_t lt_store_writer_commit(lt_store_writer_t *w, uint8_t sha256[32], uint64_t *size,
                                char *errstr, size_t errstr_size);

/* Between bursts of writes (an upload waiting for its next part): sends what the writer buffers
 * where the backend can (S3: as a part once at least 5 MiB are buffered) and shrinks its buffer
 * to what it still holds, so an idle writer keeps less than one part in memory. On error the
 * writer is dead: call abort. */
lt_err_t lt_store_writer_flush(lt_store_writer_t *w, char *errstr, size_t errstr_size);

/* Drops everything written (aborts the multipart upload, removes the temp file) and frees the
 * writer. NULL allowed. */
void lt_store_writer_abort(lt_store_writer_t *w);

/* ---- helpers ------------------------------------------------------------------------------- */

/* Checks a key of len bytes against the rules above (len, so embedded NULs are caught). */
lt_err_t lt_store_key_check(const char *key, size_t len, char *errstr, size_t errstr_size);

/* True for errors a caller may retry later (LT_ERR_UNAVAILABLE, LT_ERR_RETRIABLE,
 * LT_ERR_TIMEOUT). */
bool lt_store_err_retriable(lt_err_t err);

/* The wait between two tries of work that failed as retriable, for callers that retry past the
 * store's own attempts (a checkpoint upload, an attempt's input fetch): sleeps *delay_ms in steps
 * of 50 ms, adds it to *waited_ms and doubles it (at most 5 s; start it at 200). False, at once,
 * when *abort is or becomes set. */
bool lt_store_retry_wait(const atomic_int *abort, int64_t *waited_ms, int64_t *delay_ms);

#endif
