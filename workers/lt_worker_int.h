/* lt_worker_int: the worker role's tables (lt_worker.c), for the files of the role that need
 * them. Not an interface: lt_worker.h is. */
#ifndef LT_WORKER_INT_H
#define LT_WORKER_INT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <event2/event.h>
#include <jansson.h>

#include "lt_ckpt.h"
#include "lt_confine.h"
#include "lt_jobspec.h"
#include "lt_proj.h"
#include "lt_worker.h"
#include "lt_worker_gang.h"
#include "lt_worker_session.h"
#include "lt_worker_setup.h"
#include "lt_xfer.h"

#define MAX_SLOTS 64
#define MAX_PENDING 256

typedef enum { A_FREE = 0, A_RUNNING, A_EXITED } att_state_t;

typedef struct attempt {
  att_state_t state;
  lt_worker_t *w;       /* its worker, for the notify event */
  lt_jobspec_t spec;    /* what it runs (validated) */
  bool uploading;       /* a checkpoint upload is in flight */
  char job_id[LT_ID_MAX + 1], tenant_id[LT_ID_MAX + 1];
  int32_t attempt;
  lt_job_class_t cls;
  pid_t pid;
  int out_fd;           /* the executor's stdout: its JSON lines */
  int in_fd;            /* its stdin, after the assignment: the commits recorded for it */
  struct event *ev;
  char *line;           /* the executor's output not yet read to a newline */
  size_t line_len, line_cap;
  lt_wsess_t *sess;     /* a training session's calls and results (lt_worker_session.h) */
  char work_dir[720];    /* on disk, the executor's: where it seals its checkpoints */
  char mem_dir[720];     /* on a memory file system, the executor's: its plaintext files */
  int notify[2];        /* the fetch and upload threads' "ended" bytes (see on_notify) */
  struct event *notify_ev;
  lt_xfer_t *xfer;      /* the inputs being fetched, before the executor starts */
  lt_xfer_inputs_t in;  /* the inputs it was handed, zeroed when the attempt ends */
  lt_store_t *sealed;   /* the executor's sealed checkpoints (a directory store on work_dir) */
  lt_ckpt_t *up;        /* uploads them into the store */
  lt_ckpt_done_t uploaded; /* what the upload in flight stored (written by its thread) */
  char fail_detail[512]; /* why the worker ended the attempt, when it did */
  int64_t lease_ms;
  int64_t last_progress_ms, stop_sent_ms;
  int stop_signal;      /* SIGUSR1 (cancel) or SIGUSR2 (preempt) once sent */
  bool fenced;          /* not the job's live attempt any more: record nothing */
  bool store_away;      /* ended by the worker: its checkpoint upload met the store away past the window */
  bool reported;        /* the terminal line (done/stopped/error) was recorded */
  lt_worker_end_t outcome; /* what that line said (lt_worker_stats) */
  bool killed;          /* we sent SIGKILL */
  int64_t step;
  char final_ckpt_event[40], final_ckpt_sha[65];
  /* A part of a gang across workers (gang_world > 1): rank 0 speaks for the attempt, the others'
   * records are muted but an unavailable stop (nothing of the gang ran: the others waited to
   * join). The join (lt_worker_gang.h), then the connections it handed over. */
  int gang_rank, gang_world, gang_nfds, gang_fds[LT_WGANG_MAX_FDS];
  char gang_rdv[300];
  lt_wgang_t *gang;
  bool gang_joined;
} attempt_t;

typedef struct pending {
  char job_id[LT_ID_MAX + 1];
  int32_t attempt;
  lt_job_class_t cls;
  int64_t since_ms;
  int64_t lease_ms;
  lt_jobspec_t spec;    /* read from the JobDispatched record and validated ... */
  lt_err_t spec_err;    /* ... or why it is not valid */
  char spec_msg[512];
  int gang_rank, gang_world; /* JobDispatched v2: this worker's part of a gang (world 1: none) */
  char gang_rdv[300];
} pending_t;

struct lt_worker {
  lt_worker_conf_t conf;
  struct event_base *base;
  lt_bus_producer_t *producer;
  lt_bus_consumer_t *control, *dispatch;
  struct event *control_ev, *dispatch_ev, *tick_ev;
  lt_proj_t *proj;
  lt_avro_decoder_t *dec;
  lt_recmac_key_t *op_mac;      /* from conf.kek: an operator's WorkerDrainRequested is signed under it */
  const lt_bus_msg_t *folding;  /* the control record being folded (its MAC header, for on_folded) */
  char hb_ids[128][40];         /* the event ids of this run's newest heartbeats (a ring): a drain */
  unsigned hb_next;             /* request names one (WorkerDrainRequested.heartbeat_event_id) */
  lt_avro_record_t *rec[16];
  char t_control[128], t_progress[128], t_workers[128], t_calls[128], t_dispatch[LT_CLASS__COUNT][128];
  attempt_t slots[MAX_SLOTS];
  pending_t pending[MAX_PENDING];
  int npending;
  json_t *owned;            /* [{topic, partition}] of the dispatch group */
  bool dispatch_paused;
  bool draining;             /* lt_worker_drain: no new attempt, the running ones asked to stop */
  bool dispatch_reassigned; /* a rebalance assigned partitions: apply the pause state to them */
  int64_t hb_seq;
  int64_t last_hb_sent_ms;
  int64_t hb_ok_ms;         /* last heartbeat the broker acknowledged (atomic) */
  lt_worker_stats_t st;     /* counters since creation (lt_worker_stats) */
  char producer_id[160];
  lt_confine_conf_t confine; /* what executors may do (lt_confine.h) */
  lt_worker_devices_t dev;   /* what they train on: the cpu, or slot i on GPU i */
  char work_parent[512], mem_parent[512]; /* <work_root>/lathe-<id>, <mem_root>/lathe-<id> (0711) */
  int dir_lock;                           /* <mem_parent>.lock, held shared (lt_worker_confinement) */
};

/* A WorkerDrainRequested folded from lathe.control (m: its message), acted on when it is for this
 * worker's run and signed (lt_worker_ops.c). */
void lt_worker_drain_requested(lt_worker_t *w, lt_avro_record_t *rec, const lt_bus_msg_t *m);

#endif
