/* lt_ckpt: a checkpoint's files sealed and uploaded to staging off the training thread.
 *
 * Why a thread: sealing (AES-256-GCM, SHA-256) and uploading a checkpoint costs most of what a
 * checkpoint costs (bench/bench_ckpt: ~80 % of it for a SmolLM2-shape LoRA state). Training
 * goes on while the previous checkpoint travels; only its commit comes later, and a commit is
 * what makes a checkpoint count (docs/DESIGN.md §4.5: a crash loses the steps since the last
 * *committed* checkpoint), so nothing is promised early. How far training may run ahead of the
 * newest commit is the caller's choice: the executor holds the update after a checkpoint until
 * the worker has recorded its commit, so a crash loses at most one checkpoint interval while the
 * upload overlaps that step's forward and backward passes (test_e2e's kill -9 case asserts it).
 *
 * One upload at a time: lt_ckpt_submit() first waits for the one in flight, so at most two
 * checkpoints' files are on disk and commits arrive in step order. The files are moved out of
 * the training loop's directory (a rename) before submit returns, so the loop may write the next
 * checkpoint at once.
 *
 * Threads: every call from one thread (the training thread); the done callback runs on the
 * upload thread, never after lt_ckpt_abort() or lt_ckpt_destroy() returned. */
#ifndef LT_CKPT_H
#define LT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_crypto.h"
#include "lt_err.h"
#include "lt_store.h"

/* A checkpoint's objects, in the order its commit record names them (the publisher relies on
 * it), as lt_train_run writes them into its work directory. */
extern const char *const lt_ckpt_names[];
#define LT_CKPT_NAMES 7

/* One uploaded checkpoint: what its CheckpointCommitted record carries. */
typedef struct lt_ckpt_done {
  int64_t step;
  bool final;
  const char *trigger;            /* "final", "preempt" or "interval": as submitted */
  const char *keys[LT_CKPT_NAMES]; /* object keys, lt_ckpt_names order */
  char sha256_hex[65];            /* of the stored (encrypted) bytes of all objects, in order */
  uint64_t bytes;                 /* stored bytes of all objects */
} lt_ckpt_done_t;

typedef struct lt_ckpt_conf {
  lt_store_t *store;          /* borrowed; must outlive the uploader */
  const lt_crypto_dek_t *dek; /* borrowed; the tenant's data key (NULL with copy_from) */
  const char *prefix;         /* staging/<tenant>/<job>/<attempt>/ (copied); keys are prefix<step>/<name> */
  const char *spool_dir;      /* private directory for files in flight (copied; must exist, 0700;
                               * NULL with copy_from) */
  /* The worker's mode: the checkpoint's objects are already sealed, under the same keys, in this
   * store (borrowed: the executor's sealed spool, a directory store), and are copied byte for
   * byte into store, then deleted from it. lt_ckpt_submit's dir is then ignored. */
  lt_store_t *copy_from;
  int64_t retry_ms;           /* how long a retriable store failure is retried (0: not at all) */
  /* Called on the upload thread once a checkpoint is stored, before the next may start. */
  void (*on_done)(void *ctx, const lt_ckpt_done_t *done);
  /* Called on the upload thread as its last act, whatever happened (may be NULL): the worker's
   * event loop learns from it that lt_ckpt_flush will not block. */
  void (*on_end)(void *ctx);
  void *ctx;
} lt_ckpt_conf_t;

typedef struct lt_ckpt lt_ckpt_t;

lt_err_t lt_ckpt_new(const lt_ckpt_conf_t *conf, lt_ckpt_t **out, char *errstr, size_t errstr_size);

/* Waits for the upload in flight (its failure is returned, and this one is not started), then
 * moves the checkpoint's files out of dir and starts uploading them (with copy_from: starts
 * copying its objects). */
lt_err_t lt_ckpt_submit(lt_ckpt_t *u, const char *dir, int64_t step, bool final, const char *trigger, char *errstr,
                        size_t errstr_size);

/* True while an upload is in flight (its on_done not yet returned, or it failed and nobody has
 * flushed yet); never blocks. */
bool lt_ckpt_busy(lt_ckpt_t *u);

/* Waits for the upload in flight; returns its failure, if any. */
lt_err_t lt_ckpt_flush(lt_ckpt_t *u, char *errstr, size_t errstr_size);

/* Drops the upload in flight at its next write: nothing more of it is stored, what it stored is
 * deleted, and on_done is not called. Returns once the upload thread has stopped. */
void lt_ckpt_abort(lt_ckpt_t *u);

/* Aborts what is in flight (as lt_ckpt_abort), removes spooled files and frees. NULL is fine. */
void lt_ckpt_destroy(lt_ckpt_t *u);

#endif
