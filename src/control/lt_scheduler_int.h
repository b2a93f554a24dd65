/* lt_scheduler_int.h: what lt_scheduler.c (leadership, membership, the fold feed, transactions),
 * lt_scheduler_decide.c (validation, lt_sched bookkeeping, decisions, record writing) and
 * lt_scheduler_ops.c (the operator endpoint) share:
 * the scheduler's struct, its per-job and per-worker tables, and the functions that cross. */
#ifndef LT_SCHEDULER_INT_H
#define LT_SCHEDULER_INT_H

#include <jansson.h>

#include "lt_job.h"
#include "lt_jobspec.h"
#include "lt_map.h"
#include "lt_scheduler.h"

/* The records a term writes, one reusable lt_avro_record_t each (rec_types[] in lt_scheduler.c). */
enum { R_ACC, R_REJ, R_DISP, R_PRE, R_FAIL, R_CANC, R_STOP, R_DEAD, R_N };
enum { T_JOBS = 0, T_CONTROL, T_WORKERS, T_TENANTS, T_NFOLD };
enum { O_CONTROL = 0, O_DISPATCH0, O_DEADLETTER = O_DISPATCH0 + LT_CLASS__COUNT, O_N };
#define MAX_TPS 256
#define MAX_MODELS 16
/* Workers one gang may span: an executor inherits at most 8 connections to the others
 * (workers/lt_worker_gang.h). A wider placement is dropped from the policy with a log line. */
#define GANG_MAX 9
#define DECIDE_CAP 256

/* Per-job bookkeeping of a term. The first part is derived from folded records (so it is rebuilt
 * by replay); the w_* part remembers what this term wrote and has not read back yet. */
typedef struct side {
  char job_id[LT_ID_MAX + 1];
  char submitted_event_id[40];
  char cancel_event_id[40];
  char requested_by[64];
  char ckpt_event_id[40];
  lt_jobspec_t spec;
  lt_err_t spec_err;
  char spec_field[96];
  char spec_msg[256];
  int64_t first_seen_ms;
  int64_t dispatched_at_ms; /* current attempt's JobDispatched */
  int64_t lease_deadline_ms; /* newest known for the current attempt */
  /* this term's writes */
  int32_t w_dispatch_attempt;
  int32_t w_lost_attempt;
  int32_t w_preempt_attempt;
  int32_t preempt_owed; /* the attempt lt_sched preempted before it started (0: none): asked once it runs */
  int32_t unbooked_tried; /* the attempt examine last tried to book where it runs (rebuild_running) */
  int32_t redispatch_for;
  bool w_decided, w_terminal;
  /* lt_sched's view */
  bool in_sched, sched_running, dirty;
  uint32_t sched_worker;   /* rank 0's, for a gang across workers */
  uint32_t gang_n;         /* that gang's workers (gang_w; 0: a job on one worker) */
  uint32_t gang_w[GANG_MAX];
  uint64_t gang_mask[GANG_MAX]; /* each rank's GPUs there (0: not recorded, JobDispatched < v4) */
} side_t;

typedef struct worker {
  char id[LT_ID_MAX + 1];
  uint32_t slots;
  uint64_t mem;
  int64_t last_hb_ms;
  bool draining, up;
  int nmodels;
  char models[MAX_MODELS][LT_JOB_NAME_MAX];
  bool models_changed;
  /* WorkerHeartbeat v2: its node group and gang rendezvous address, both or none (then it is a
   * group of its own: no gang spans it) */
  char group[LT_JOB_NAME_MAX], rdv[256];
  /* dispatches to it not started in time in a row (reset when it starts one), and until when it
   * takes no new work for that (scheduler_worker_missed_start) */
  int missed_starts;
  int64_t cordon_until_ms;
  /* its heartbeat lists a dispatch partition of every class it owns in the workers' group; one
   * that lists none (of some class) while another worker lists all was left none (more workers
   * than partitions) or is not yet assigned: a dispatch to it would land on another worker's
   * partition (sync_workers) */
  bool owns_partitions, partless_said;
} worker_t;

typedef struct out_rec {
  int topic;
  char key[LT_ID_MAX + 1];
  bool has_key;
  void *bytes;
  size_t len;
  int32_t partition; /* LT_BUS_PARTITION_ANY, or the one a dispatch must reach */
} out_rec_t;

struct lt_scheduler {
  struct event_base *base;
  lt_scheduler_conf_t conf;
  char producer_id[160], txn_id[200], group_id[200];
  lt_sched_config_t policy;
  char fold_topics[T_NFOLD][200];
  char out_topics[O_N][200];
  /* membership */
  lt_bus_consumer_t *group;
  struct event *group_ev, *tick_ev;
  bool own_p0, fenced;
  lt_scheduler_role_t role;
  lt_scheduler_stats_t st;
  /* the term */
  lt_bus_producer_t *prod;
  lt_bus_consumer_t *fold_c;
  struct event *fold_ev;
  lt_proj_t *fold;
  lt_sched_t *sched;
  bool sched_full; /* a tenant, worker or job did not fit lt_sched's tables: a new term sizes them */
  lt_avro_record_t *rec[R_N]; /* one reusable record per type written */
  side_t **sides;
  size_t nsides, capsides;
  lt_map_t *side_idx; /* job_id -> index + 1 */
  worker_t *workers;
  size_t nworkers, capworkers;
  lt_map_t *worker_idx; /* worker_id -> index + 1 */
  lt_map_t *tenant_ids; /* tenant_id -> lt_sched id (index in tenant_names + 1) */
  char **tenant_names;
  size_t ntenants, captenants;
  lt_bus_tp_t tps[MAX_TPS];
  int64_t next[MAX_TPS], committed[MAX_TPS], hwm[MAX_TPS], low[MAX_TPS]; /* low: oldest offset kept at start */
  size_t ntps;
  int tp_base[T_NFOLD], tp_count[T_NFOLD];
  int64_t last_msg_ms, catchup_since_ms, last_scan_ms;
  double now_s;
  out_rec_t *out;
  size_t nout, capout;
  bool offsets_dirty;
  /* the operator endpoint (lt_scheduler_ops.c) */
  struct evhttp *ops_http;
  uint16_t ops_port;
};

/* ---- lt_scheduler.c ------------------------------------------------------------------------- */

/* The side table entry of job_id (its index in *idx_out when not NULL), added when add; NULL
 * when absent and !add, or out of memory. */
side_t *scheduler_side_get(lt_scheduler_t *s, const char *job_id, bool add, size_t *idx_out);
/* lt_sched id of a tenant name (1-based), added the first time; 0 when out of memory. */
uint64_t scheduler_tenant_id(lt_scheduler_t *s, const char *name);
/* Encodes rec and appends it to the batch for out topic `topic`, keyed by key (a string) or
 * key_bytes; the batch is written by scheduler_flush(). */
lt_err_t scheduler_emit(lt_scheduler_t *s, int topic, const char *key, const void *key_bytes,
                        size_t key_len, lt_avro_record_t *rec);
/* Writes the batch and the fold's offsets in one transaction; a failure ends the term. */
void scheduler_flush(lt_scheduler_t *s);

/* ---- lt_scheduler_ops.c --------------------------------------------------------------------- */

/* Opens the operator endpoint when conf.operator_bind_addr is set; closes it (NULL is fine). */
lt_err_t scheduler_ops_open(lt_scheduler_t *s, char *errstr, size_t n);
void scheduler_ops_close(lt_scheduler_t *s);

/* ---- lt_scheduler_decide.c ------------------------------------------------------------------ */

void scheduler_write_deadletter(lt_scheduler_t *s, const lt_bus_msg_t *m, lt_err_t code,
                                const char *reason);
uint64_t scheduler_tenant_into_sched(lt_scheduler_t *s, const char *tenant, bool placing);
/* Takes job sd out of lt_sched (releasing what it booked); no-op when it is not there. */
/* The job of sd is booked on worker w (rank 0's, or another of its gang's workers). */
bool scheduler_side_on_worker(const side_t *sd, size_t w);
void scheduler_drop(lt_scheduler_t *s, side_t *sd);
/* A tenant, worker or job that lt_sched's tables could not take (why): said once, and the term
 * ends after this feed; the next one sizes the tables for what the log holds (scheduler_rebuild). */
void scheduler_sched_full(lt_scheduler_t *s, const char *why);
/* A dispatch to worker_id was not started in time: the worker takes no new work for a while
 * (the start timeout, doubled for each miss in a row, at most 8 times): one that heartbeats but
 * cannot see its dispatches (cut from some brokers) would otherwise get the redispatch again. */
void scheduler_worker_missed_start(lt_scheduler_t *s, const char *worker_id, int64_t now_ms);
/* worker_id started an attempt: it takes work again at once. */
void scheduler_worker_started(lt_scheduler_t *s, const char *worker_id);
/* Builds lt_sched from the fold when a term starts leading. */
lt_err_t scheduler_rebuild(lt_scheduler_t *s, int64_t now_ms, char *errstr, size_t n);
/* One pass while leading: workers, every job that changed (all of them every 250 ms), lt_sched's
 * decisions, then the batch in one transaction. */
void scheduler_step(lt_scheduler_t *s);

#endif
