/* lt_publisher: `lathed publisher`, promotion of committed final checkpoints to published
 * artifacts (docs/DESIGN.md §4 invariant 4, §8).
 *
 * ---- The checkpoint layout: the contract between the worker and the publisher ----
 *
 * Staging (written by the worker, never served):
 *
 *   staging/<tenant>/<job>/<attempt>/<step>/<name>
 *
 * <attempt> and <step> in plain decimal (no sign, no leading zeros); build keys with
 * lt_publisher_staging_key(). <name> is one of:
 *
 *   adapter_model.safetensors  the adapter, PEFT layout                    required, published
 *   adapter_config.json        PEFT adapter config                         required, published
 *   lathe_run.json             {"config_digest":"<64 hex>","spec":{..}}    required, published
 *   eval.json                  eval report                                 optional, published
 *   metrics.json               training metrics                            optional, published
 *   samples.json               a few validation prompts, greedy outputs of  optional, published
 *                              the base model and of the fine-tuned one
 *   state.bin                  optimizer, RNG, data cursor (resume only)   optional, never published
 *
 * Every object is one LTE1 stream sealed with the tenant's data key under its own key
 * (lt_sealed_put / lt_sealed_writer), so a byte copy to another key does not decrypt.
 *
 * CheckpointCommitted (lathe.control, acks=all, only after every object is written):
 *   object_keys  the staging keys, in the order the worker chose (each name at most once; all
 *                share staging/<tenant>/<job>/<attempt>/<step>/ with the record's tenant, job,
 *                attempt and step);
 *   sha256       lowercase hex SHA-256 over the STORED (encrypted) bytes of all objects
 *                concatenated in object_keys order;
 *   bytes        their total stored size;
 *   final        true for the job's last checkpoint (the one JobCompleted names and the
 *                publisher promotes).
 * JobCompleted.checkpoint_event_id / checkpoint_sha256 name that final checkpoint (empty: the
 * newest committed one of the live attempt).
 *
 * Published (written by the publisher only):
 *
 *   tenants/<tenant>/artifacts/<job>/<name>       every staged name except state.bin
 *
 * sealed with the tenant's data key under exactly that key. ArtifactPublished (lathe.artifacts,
 * key job_id) lists {name, key, sha256 and bytes of the PLAINTEXT}, the promoted checkpoint's
 * event id and config_digest (from lathe_run.json); the API serves only what it lists.
 *
 * ---- What the publisher does ----
 *
 * It folds lathe.jobs, lathe.control, lathe.tenants and lathe.artifacts from the beginning
 * through lt_proj (the one fold; read_committed), under the consumer group "<topic prefix>publisher".
 * Once caught up with the topics as of start-up, for each job whose state is COMPLETED (the fold
 * already makes a cancel recorded first win and ignores fenced attempts) and whose newest
 * checkpoint is final and of the current attempt, it:
 *   1. reads every staged object, checks the SHA-256 and size of the stored bytes against the
 *      commit record (and JobCompleted's copy), decrypts each (every chunk authenticated);
 *   2. re-encrypts each under its artifact key (decrypt, verify, re-encrypt: a copy would not
 *      decrypt under the new key);
 *   3. only then produces ArtifactPublished (acks=all) and afterwards commits the group's
 *      lathe.control offsets up to the oldest completion still waiting.
 * Idempotent: keys are deterministic, the plaintext hashes are those of the staged plaintext,
 * the record's event_id is derived from job id and checkpoint event id, and a job that the
 * projection shows published from the same checkpoint is skipped (a restart before the offset
 * commit finds it so). A job is never published from a second, different checkpoint.
 * A SHA/size mismatch, an object that fails to decrypt or a layout that breaks the contract is
 * never promoted: logged and a DeadLetter (lathe.deadletter) naming the reason, nothing else.
 * A retriable object store error (lt_store_err_retriable) postpones the job with exponential
 * backoff; nothing is produced before the objects are written.
 *
 * Retention: a job keeps in staging its newest committed checkpoint (the final one, once
 * completed: kept so a replay can promote again) and the keep_checkpoints committed checkpoints
 * before it, each whole (optimizer state included); everything else of the job is garbage (a live
 * training session keeps every checkpoint: they are the states it saved by name). Once
 * a completed job is published, that garbage is deleted at once (stats.pruned), not after the
 * grace period: older checkpoints, their optimizer state, and objects of uploads that were never
 * committed.
 *
 * Garbage collection (every gc_interval_ms once caught up): for every known tenant, staging
 * objects under staging/<tenant>/ older than the grace period are deleted unless retention keeps
 * them for a job that is not terminal or is COMPLETED, or they are a live job's current attempt's
 * past its newest commit folded (the commit of an upload can come late). Cancelled, failed and rejected jobs lose
 * all their staging objects once both the object and the job's end are older than the grace
 * period; a deleted job (JobDeleted) loses them whatever its state. A training session's call
 * bodies and results (sessions/<tenant>/<job>/) are kept while it is not terminal and for the
 * grace period after its end (the customer reads results for that long), then deleted. An object
 * of a job the projection does not know is kept: only a dispatched job has staging objects and
 * only a known session gets calls, so the job's records are still on their way to this publisher
 * (it lags on one topic: deleting there lost a published job's final checkpoint, chaos seed 2001).
 * Each tenant's datasets missing their data, key or meta (an upload or a delete that died half
 * way), every object older than the grace period and found so by the pass before too, are
 * deleted (lt_dataset_sweep.h).
 *
 * Keys: a job's artifacts are sealed under a data key of their own (key id: the job id), wrapped
 * by the master key at tenants/<tenant>/artifacts/<job>/key.wrapped before any artifact is
 * written, and reused by a repeated promotion. The key is derived from the tenant's key and the
 * job id (lt_publisher_artifact_dek), not drawn at random: two publishers that promote one
 * completion at once each write key.wrapped and artifacts, the last writes win, and every object
 * still opens under the stored key. DELETE /v1/jobs/{id} removes it first: what is
 * left of the artifacts anywhere then decrypts no more (crypto-shred). A deleted job is never
 * promoted. Only staging/ of
 * tenants in lathe.tenants is ever listed or deleted.
 *
 * Threads: everything runs on the caller's event_base thread (consumer fd and a periodic timer);
 * promotion does blocking store I/O there. lt_publisher_promote() is thread-safe for distinct
 * checkpoints. */
#ifndef LT_PUBLISHER_H
#define LT_PUBLISHER_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_err.h"
#include "lt_recmac.h"
#include "lt_store.h"

#define LT_PUBLISHER_MAX_OBJECTS 16 /* objects in one checkpoint */
#define LT_PUBLISHER_NAME_MAX 64

typedef struct lt_publisher lt_publisher_t;

typedef struct lt_publisher_conf {
  const lt_bus_conf_t *bus;           /* borrowed */
  lt_store_t *store;                  /* borrowed */
  const lt_crypto_kek_t *kek;         /* borrowed: unwraps tenants' data keys */
  /* borrowed; TenantUpserted folds only with a valid MAC under it (docs/DESIGN.md §5a). lathed
   * always sets it; NULL (tests of other behaviour) folds tenants unchecked. */
  const lt_recmac_key_t *tenant_mac;
  const lt_avro_registry_t *registry; /* borrowed */
  const char *producer_id;            /* identity in records, e.g. "publisher/host-1" */
  const char *group_id;               /* NULL: "<topic prefix>publisher" */
  int64_t gc_grace_ms;                /* staging objects younger than this are kept; 0: 1 h */
  int64_t gc_interval_ms;             /* 0: min(grace, 60 s); < 0: no periodic GC */
  int tick_ms;                        /* timer period; 0: 200 */
  int produce_timeout_ms;             /* per record; 0: 15000 */
  int64_t retry_max_ms;               /* backoff cap for store errors; 0: 60000 */
  uint64_t max_checkpoint_bytes;      /* largest checkpoint promoted (held in memory); 0: 1 GiB */
  int settle_ms;                      /* catch-up fallback: quiet this long means caught up; 0: 2000 */
  int keep_checkpoints;               /* committed checkpoints a job keeps in staging besides its newest
                                         (the final one, once completed); 0: 2; < 0: none */
  bool log_commits;                   /* log every checkpoint commit read during catch-up too (after
                                         it, each is logged anyway): LATHE_PUBLISHER_LOG_COMMITS */
} lt_publisher_conf_t;

/* Counters since creation (a copy). */
typedef struct lt_publisher_stats {
  bool ready;                 /* caught up with the topics as of start-up */
  uint64_t folded;            /* records folded */
  uint64_t undecodable;       /* records lt_proj refused (skipped; counted) */
  uint64_t published;         /* ArtifactPublished records this instance wrote */
  uint64_t already_published; /* completions found already published from the same checkpoint */
  uint64_t rejected;          /* checkpoints refused for good (SHA, decrypt, layout) */
  uint64_t retries;           /* promotions postponed by a retriable error */
  uint64_t gc_deleted;        /* staging objects deleted */
  uint64_t gc_kept;           /* staging objects seen and kept by the last GC pass */
  uint64_t pruned;            /* staging objects deleted at completion (retention) */
  uint64_t datasets_swept;    /* objects of datasets that never came to exist (lt_dataset_sweep.h) */
  uint64_t unfolded_resumes;  /* dispatches resuming from a commit this instance never folded */
  size_t waiting;             /* completions waiting to be promoted */
  lt_err_t last_err;          /* last promotion failure (LT_ERR_UNAVAILABLE: store down) */
  char last_errmsg[256];
} lt_publisher_stats_t;

/* Creates the publisher: looks the topics up, starts folding from the beginning and registers
 * the consumer fd and the timer on base. conf is copied (its borrowed pointers must outlive the
 * publisher). */
lt_err_t lt_publisher_new(struct event_base *base, const lt_publisher_conf_t *conf, lt_publisher_t **out,
                          char *errstr, size_t errstr_size);

void lt_publisher_stats(const lt_publisher_t *p, lt_publisher_stats_t *out);

/* The operator endpoint's /metrics (Prometheus text, malloc'd; NULL when out of memory) and
 * /healthz (200 once caught up, else 503; *json malloc'd). On the publisher's event loop. */
char *lt_publisher_metrics(lt_publisher_t *p);
int lt_publisher_health(lt_publisher_t *p, char **json);

/* Runs one GC pass now (also before the first periodic one); *deleted (may be NULL) gets the
 * count. LT_ERR_RETRIABLE while not caught up; store errors as lt_store. */
lt_err_t lt_publisher_gc(lt_publisher_t *p, uint64_t *deleted, char *errstr, size_t errstr_size);

/* Stops, frees. Offsets not committed stay uncommitted (a restart redoes that work). NULL ok. */
void lt_publisher_destroy(lt_publisher_t *p);

/* ---- the layout, for the worker and tests ---- */

/* staging/<tenant>/<job>/<attempt>/<step>/<name>. LT_ERR_INVALID when it does not fit in size,
 * a component is empty or holds '/', or attempt < 1 or step < 0. */
lt_err_t lt_publisher_staging_key(char *out, size_t size, const char *tenant, const char *job, int32_t attempt,
                                  int64_t step, const char *name);

/* tenants/<tenant>/artifacts/<job>/<name>. */
lt_err_t lt_publisher_artifact_key(char *out, size_t size, const char *tenant, const char *job, const char *name);

/* ---- one promotion, without Kafka (the daemon's step; the benchmark times it) ---- */

typedef struct lt_publisher_checkpoint {
  const char *tenant_id;
  const char *job_id;
  int32_t attempt;
  int64_t step;
  const char *const *object_keys; /* nkeys staging keys, in commit order */
  size_t nkeys;
  const char *sha256_hex;         /* of the stored bytes, concatenated */
  uint64_t bytes;                 /* stored bytes in all */
  const lt_crypto_dek_t *artifact_dek; /* seals the artifacts (the job's own key); NULL: dek */
} lt_publisher_checkpoint_t;

/* The artifact key of tenant_dek's job `job`: HKDF of the tenant's key and the job id, key id the
 * job id; the same inputs give the same key in every process. *out is the caller's. */
lt_err_t lt_publisher_artifact_dek(const lt_crypto_dek_t *tenant_dek, const char *job, lt_crypto_dek_t **out,
                                   char *errstr, size_t n);

/* The key of a job's artifact key, wrapped by the master key: deleting it shreds the artifacts. */
lt_err_t lt_publisher_artifact_dek_key(char *out, size_t size, const char *tenant, const char *job);

typedef struct lt_publisher_artifact {
  char name[LT_PUBLISHER_NAME_MAX];
  char key[LT_STORE_KEY_MAX + 1];
  char sha256[65]; /* lowercase hex, of the plaintext */
  uint64_t bytes;  /* plaintext */
} lt_publisher_artifact_t;

typedef struct lt_publisher_promotion {
  size_t n;
  lt_publisher_artifact_t artifacts[LT_PUBLISHER_MAX_OBJECTS]; /* in commit order */
  char config_digest[65];
  uint64_t stored_bytes_read; /* staging bytes read */
} lt_publisher_promotion_t;

/* Reads, verifies, decrypts with dek and re-encrypts under the artifact keys every published
 * object of ck. Writes nothing unless the whole checkpoint verified. Errors: LT_ERR_INVALID (the
 * layout above is broken: the message names the key or field), LT_ERR_CORRUPT (SHA-256 or size
 * of the stored bytes differs from the commit, or an object does not decrypt), LT_ERR_NOT_FOUND
 * (a staged object is missing), LT_ERR_INVALID also when the checkpoint exceeds max_bytes, and
 * the store's errors (lt_store_err_retriable() ones are worth retrying). Plaintext buffers are
 * scrubbed before release. */
lt_err_t lt_publisher_promote(lt_store_t *store, const lt_crypto_dek_t *dek, const lt_publisher_checkpoint_t *ck,
                              uint64_t max_bytes, lt_publisher_promotion_t *out, char *errstr, size_t errstr_size);

#endif
