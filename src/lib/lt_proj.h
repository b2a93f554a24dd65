/* lt_proj: the projection every control-plane process folds from the topics.
 *
 * One decode-and-fold loop for all of them (API, scheduler, publisher, replay): a message from
 * lathe.jobs, lathe.control, lathe.tenants, lathe.progress, lathe.artifacts or lathe.workers
 * goes in, the projection comes out:
 *   - jobs:    lt_job_table_t (the pure fold of lt_job.c);
 *   - tenants: lt_tenant_table_t;
 *   - per job, a JSON document of what the API shows beside the state: the spec (from
 *     JobSubmitted), the last progress (StepCompleted), evaluations (EvalCompleted), published
 *     artifacts (ArtifactPublished) and the newest checkpoint's object keys;
 *   - workers: the latest WorkerHeartbeat of each worker, as JSON.
 * Nothing here does I/O; the caller brings the bytes. Replaying the same messages gives the same
 * projection (lt_job_digest covers the job states).
 *
 * One thread at a time. */
#ifndef LT_PROJ_H
#define LT_PROJ_H

#include <jansson.h>
#include <stdint.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_job.h"
#include "lt_recmac.h"
#include "lt_tenant.h"

typedef struct lt_proj lt_proj_t;

/* Where a message came from, as the caller knows it (handed back with its result, also when the
 * record was kept aside and applied later). */
typedef struct lt_proj_origin {
  int32_t partition;
  int64_t offset;
  int tag; /* the caller's: e.g. which topic */
} lt_proj_origin_t;

/* What lt_proj_apply did. */
typedef struct lt_proj_result {
  const char *type;             /* record type decoded ("JobSubmitted"), or NULL */
  lt_job_outcome_t job_outcome; /* for job records */
  const char *job_id;           /* for job records; valid until the next apply */
  lt_avro_record_t *record;     /* the decoded record, owned by the projection's decoder */
  lt_proj_origin_t origin;      /* lt_proj_fold_at's origin (zeros otherwise) */
  const void *message;          /* the message's bytes, valid until the call or callback returns */
  size_t message_len;
} lt_proj_result_t;

/* reg is borrowed and must outlive the projection. */
lt_err_t lt_proj_new(const lt_avro_registry_t *reg, lt_proj_t **out, char *errstr, size_t errstr_size);
void lt_proj_destroy(lt_proj_t *p);

/* Decodes one message and folds it. Errors: LT_ERR_CORRUPT / LT_ERR_UNKNOWN_SCHEMA for bytes
 * that do not decode (the caller sends them to lathe.deadletter with the message) and
 * LT_ERR_INVALID for a record that decodes but cannot be applied (same). A record of a type the
 * projection does not fold is LT_OK with nothing changed. res may be NULL. */
lt_err_t lt_proj_apply(lt_proj_t *p, const void *buf, size_t len, lt_proj_result_t *res, char *errstr,
                       size_t errstr_size);

/* Called for every record lt_proj_fold applied (and for records it skipped: res says). */
typedef void lt_proj_cb(void *ctx, const lt_proj_result_t *res);

/* lt_proj_apply for a record this process wrote, folded when the broker acknowledged it at
 * (partition, offset), before the consumer reads it (an api's read-your-writes of a new job). A
 * JobSubmitted that made a job is remembered: should the consumer then read an earlier
 * JobSubmitted of the same id on that partition (the same job submitted again elsewhere, an
 * idempotency key retried on another api), the job takes that one's fields (lt_job_reseed), so
 * the projection equals a fold in log order (chaos seed 8507). cb (may be NULL) sees the record,
 * then the job's records the consumer had kept aside (read before the job was known), applied now
 * as lt_proj_fold_at would (chaos seed 6514: they stayed aside for good, the job never left
 * "submitted" in that api). res (may be NULL) gets the record's result, whose record field is
 * only valid in cb. */
lt_err_t lt_proj_apply_early(lt_proj_t *p, const void *buf, size_t len, int32_t partition, int64_t offset,
                             lt_proj_cb *cb, void *ctx, lt_proj_result_t *res, char *errstr, size_t errstr_size);

/* How many jobs an earlier JobSubmitted in the log re-seeded (see lt_proj_apply_early). */
uint64_t lt_proj_reseeded(const lt_proj_t *p);

/* lt_proj_apply in log order across topics: a job record (or an ArtifactPublished or JobDeleted) for a job
 * whose JobSubmitted has not been folded yet (jobs, control and artifacts are different topics,
 * read at different speeds) is kept aside and applied, in arrival order, right after that
 * JobSubmitted. cb (may be NULL) sees each applied record, the released ones included. At most
 * 100,000 records wait; beyond that the oldest are dropped and counted (lt_proj_orphans). Errors
 * as lt_proj_apply. */
lt_err_t lt_proj_fold(lt_proj_t *p, const void *buf, size_t len, lt_proj_cb *cb, void *ctx, char *errstr,
                      size_t errstr_size);

/* lt_proj_fold with the message's origin, which cb finds in res->origin (origin may be NULL). */
lt_err_t lt_proj_fold_at(lt_proj_t *p, const void *buf, size_t len, const lt_proj_origin_t *origin, lt_proj_cb *cb,
                         void *ctx, char *errstr, size_t errstr_size);

/* lt_proj_fold_at on a consumed message (a tombstone is LT_OK and folds nothing). The message
 * lets the projection check a signed record's MAC (lt_proj_require_tenant_mac). A message at or
 * below an offset this projection already folded from its partition is skipped and counted
 * (lt_proj_redelivered): a consumer whose offset was reset rereads a partition from its start
 * after a broker restart, and the fold counts every record that changed a job, so folding those
 * again made one API's state digest differ from the replay's (chaos seeds 8010, 8015). */
lt_err_t lt_proj_fold_msg(lt_proj_t *p, const lt_bus_msg_t *m, const lt_proj_origin_t *origin, lt_proj_cb *cb,
                          void *ctx, char *errstr, size_t errstr_size);

/* From now on a TenantUpserted folds only when its message carries a valid LT_RECMAC_HEADER under
 * key (LT_RECMAC_TENANTS; borrowed, must outlive p): a record that is unsigned, signed with another
 * master key, or folded from bytes alone (lt_proj_apply, lt_proj_fold) is refused with
 * LT_ERR_AUTH and a reason naming the tenant, and the tenant keeps its previous state
 * (docs/DESIGN.md §5a). Every daemon sets it; without it (tests, tools) tenants fold unchecked. */
void lt_proj_require_tenant_mac(lt_proj_t *p, const lt_recmac_key_t *key);

/* Every job's state as lt_job_digest hashes it (lt_job_line, without the newline), in job-id
 * order: a new array (the caller's), NULL when out of memory. */
json_t *lt_proj_job_lines(lt_proj_t *p);

/* Messages lt_proj_fold_msg skipped as read before. */
uint64_t lt_proj_redelivered(const lt_proj_t *p);

/* Records waiting for their JobSubmitted, and how many were dropped over the bound. */
size_t lt_proj_orphans(const lt_proj_t *p, uint64_t *dropped);

lt_job_table_t *lt_proj_jobs(lt_proj_t *p);
lt_tenant_table_t *lt_proj_tenants(lt_proj_t *p);

/* The job's side document ({"spec":..,"progress":..,"evals":[..],"artifacts":[..],
 * "checkpoint_keys":[..],"checkpoint":..}, and "deleted": the JobDeleted record once the tenant
 * deleted the job, after which "artifacts" stays empty), borrowed; NULL when the job is unknown. Its
 * "progress", "checkpoint" and "checkpoint_keys" are built here from the newest records folded
 * (the fold only keeps their bytes), so a value read from the document stays valid until the
 * next lt_proj_apply / lt_proj_fold followed by lt_proj_job_info of the same job. */
json_t *lt_proj_job_info(lt_proj_t *p, const char *job_id);

/* The object key of the state to resume the job from: its newest commit's "…/state.bin"
 * (borrowed, as lt_proj_job_info's values); NULL when it has none. */
const char *lt_proj_resume_key(lt_proj_t *p, const char *job_id);

/* One checkpoint a job committed (a CheckpointCommitted the fold applied). */
typedef struct lt_proj_ckpt {
  int32_t attempt;
  int64_t step;
  int64_t bytes;
  int64_t committed_at_ms; /* the record's occurred_at */
  bool final;              /* the attempt's last: what the publisher promotes */
} lt_proj_ckpt_t;

/* The job's committed checkpoints, oldest first (a fenced attempt's commits are not among them),
 * borrowed until the next lt_proj_apply / lt_proj_fold; *n how many. NULL and 0 for a job not
 * known. */
const lt_proj_ckpt_t *lt_proj_job_checkpoints(lt_proj_t *p, const char *job_id, size_t *n);

/* Latest heartbeat per worker: object worker_id -> heartbeat JSON (borrowed). */
json_t *lt_proj_workers(lt_proj_t *p);

/* Counters since creation. */
uint64_t lt_proj_applied(const lt_proj_t *p);

#endif
