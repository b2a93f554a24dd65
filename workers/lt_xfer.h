/* lt_xfer: an attempt's inputs, fetched and opened by the worker off its event loop.
 *
 * Why the worker: an executor holds no master key and no store credentials (docs/DESIGN.md §5a,
 * workers/lt_confine.h), so the worker does the store work for it. Before it spawns the executor
 * it reads, on a thread of its own (a dataset can be gigabytes, and the loop must go on renewing
 * leases), the job's sealed datasets and the state to resume from, opens each with its data key,
 * and puts the plaintext into anonymous memory files (memfd): nothing of it is written to a disk.
 * The executor gets those descriptors and the tenant's data key (to seal its checkpoints), and
 * nothing else of the store.
 *
 * When the attempt ends the worker zeroes the memory files (lt_xfer_inputs_scrub) whether or not
 * the executor got to it, and says how many bytes it zeroed.
 *
 * A store that is not there (lt_store_err_retriable) is retried with backoff for up to retry_ms,
 * as the checkpoint uploader does (docs/DESIGN.md §9): an outage at an attempt's start would
 * otherwise end the attempt as failed, and three of them the job.
 *
 * Threads: lt_xfer_start, lt_xfer_finish and lt_xfer_destroy from one thread (the worker's loop);
 * lt_xfer_abort from any; the fetch runs on its own thread, which writes one byte ('f') to
 * notify_fd as its last act. */
#ifndef LT_XFER_H
#define LT_XFER_H

#include <stdint.h>

#include "lt_crypto.h"
#include "lt_err.h"
#include "lt_store.h"

typedef struct lt_xfer_conf {
  lt_store_t *store;          /* borrowed; must outlive the fetch */
  const lt_crypto_kek_t *kek; /* borrowed; the master key */
  const char *tenant_id;      /* copied */
  const uint8_t *wrapped_key; /* the tenant's data key, wrapped by the master key (copied) */
  size_t wrapped_key_len;
  const char *train_id;       /* the training dataset (copied); NULL or "" for none (a session) */
  const char *valid_id;       /* the validation dataset or NULL (copied) */
  const char *resume_key;     /* the sealed state.bin to resume from, or NULL (copied) */
  int notify_fd;              /* written one byte, 'f', when the fetch ends */
  int64_t retry_ms;           /* how long a store that is not there is retried (0: not at all) */
} lt_xfer_conf_t;

/* What the executor is handed: memory files (-1: none) and the tenant's data key. */
typedef struct lt_xfer_inputs {
  int train_fd, valid_fd, resume_fd;
  uint64_t bytes;                       /* plaintext bytes in the three */
  uint8_t key[LT_CRYPTO_KEY_BYTES];
  char key_id[LT_CRYPTO_ID_MAX + 1];
} lt_xfer_inputs_t;

typedef struct lt_xfer lt_xfer_t;

/* Starts the fetch. */
lt_err_t lt_xfer_start(const lt_xfer_conf_t *conf, lt_xfer_t **out, char *errstr, size_t errstr_size);

/* Waits for the fetch (after notify_fd said it ended, this does not block) and moves its inputs
 * into *in (the caller scrubs them with lt_xfer_inputs_scrub); on failure returns it, naming the
 * dataset or state that could not be read, and *in holds nothing. Frees x. */
lt_err_t lt_xfer_finish(lt_xfer_t *x, lt_xfer_inputs_t *in, char *errstr, size_t errstr_size);

/* Asks the fetch to stop retrying: it ends with LT_ERR_CANCELLED at its next wait (within 50 ms)
 * or when the request in flight returns. NULL is fine. */
void lt_xfer_abort(lt_xfer_t *x);

/* Abandons the fetch: aborts it, waits for its thread, scrubs what it fetched and frees. NULL is
 * fine. */
void lt_xfer_destroy(lt_xfer_t *x);

/* An empty set of inputs (every fd -1). */
void lt_xfer_inputs_init(lt_xfer_inputs_t *in);

/* Overwrites the memory files with zeros, closes them and cleanses the key; returns the bytes
 * zeroed. Harmless on an empty set. */
int64_t lt_xfer_inputs_scrub(lt_xfer_inputs_t *in);

#endif
