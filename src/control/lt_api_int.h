/* lt_api_int: what the API's files share. Not public.
 *
 *   lt_api.c           the router (one route table), the operator port (/healthz) and the
 *                      server's life cycle
 *   lt_api_limits.c    the front door: connections and their cap, rate limits (token buckets),
 *                      libevent's own rejections rewritten into the error envelope
 *   lt_api_reply.c     JSON replies, the error envelope, request body and query helpers
 *   lt_api_feed.c      produce-then-answer, and the projection feed folded from the topics
 *   lt_api_metrics.c   /metrics and the per-route counters behind it
 *   lt_api_jobs.c      /v1/jobs: submit, list, show, cancel, artifacts
 *   lt_api_events.c    /v1/jobs/{id}/events: the SSE replay buffer and open streams
 *   lt_api_datasets.c  /v1/uploads and /v1/datasets
 *   lt_api_delete.c    DELETE /v1/jobs/{id}: recorded, crypto-shredded, deleted
 *   lt_api_quota.c     the storage quota: datasets and artifacts together; /v1/usage
 *   lt_api_work.c      the thread pool that runs blocking work (store, crypto, validation)
 *   lt_api_download.c  artifact downloads, streamed in bounded pieces
 *   lt_api_access.c    /v1/access and /v1/staff/access: the staff-access lockbox
 *   lt_api_sessions.c  /v1/sessions: training sessions and their calls; /v1/tokenize
 *   lt_api_sample.c    /v1/completions, /v1/chat/completions, /v1/models over the sampler
 *
 * Calls go one way: the router calls handlers; handlers call the reply helpers and the feed; the
 * feed calls the event streams. Nothing calls back into the router. */
#ifndef LT_API_INT_H
#define LT_API_INT_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdbool.h>

#include "lt_access.h"
#include "lt_api.h"
#include "lt_map.h"
#include "lt_metrics.h"
#include "lt_proj.h"
#include "lt_recmac.h"
#include "lt_sealed.h"
#include "lt_tenant.h"

#define LT_API_PART_MAX (8u << 20) /* largest upload part (and single-request dataset) */

typedef struct lt_api_upload lt_api_upload_t;
typedef struct lt_api_sse lt_api_sse_t;
typedef struct lt_api_pool lt_api_pool_t;
typedef struct lt_api_download lt_api_download_t;
typedef struct lt_api_conn lt_api_conn_t;
typedef struct lt_api_waiter lt_api_waiter_t;

#define LT_API_SESSION_PREFIX "ses-" /* a session's id (a job in mode interactive) */

/* Route families, as /metrics names them ("route" label). */
typedef enum lt_api_slot {
  LT_API_SLOT_HEALTH,
  LT_API_SLOT_METRICS,
  LT_API_SLOT_DATASETS,
  LT_API_SLOT_UPLOADS,
  LT_API_SLOT_JOBS,
  LT_API_SLOT_ACCESS,
  LT_API_SLOT_SESSIONS,
  LT_API_SLOT_SAMPLE,
  LT_API_SLOT_OTHER,
  LT_API_SLOT__COUNT
} lt_api_slot_t;

#define LT_API_STATUS_CLASSES 5   /* 1xx .. 5xx */

/* Counters for /metrics, by route family and status class. */
typedef struct lt_api_stats {
  uint64_t requests[LT_API_SLOT__COUNT][LT_API_STATUS_CLASSES]; /* [slot][status/100 - 1] */
  lt_metrics_hist_t latency[LT_API_SLOT__COUNT]; /* seconds to the answer (bounds in lt_api_metrics.c) */
  uint64_t produced, produce_failed, undecodable;
  uint64_t feed_healed; /* partitions whose stalled fetch was started over (lt_bus_consumer_heal_stalls) */
  uint64_t refused; /* signed records (TenantUpserted, Access*) refused for a missing or wrong MAC */
  uint64_t rate_limited, over_connections, pages_rewritten; /* the front door's refusals */
  uint64_t staff_reads_cut; /* staff reads cut mid-stream: their grant revoked or run out */
  uint64_t downloads_cut_deleted; /* downloads cut mid-stream: their job deleted */
  uint64_t held_refused;    /* long polls and event streams refused: the tenant held its share */
  uint64_t streams_cut;     /* sampling streams cut: their client left stream_backlog bytes unread */
  uint64_t events_cut_unread, events_cut_key; /* event streams cut: stream_backlog unread; key revoked */
  uint64_t tls_reloads, tls_reload_failures; /* lt_api_tls_reload: certificates taken, files refused */
} lt_api_stats_t;

struct lt_api {
  lt_api_conf_t conf;
  char producer_id[128]; /* conf.producer_id points here */
  struct event_base *base;
  struct evhttp *http;     /* the customer port */
  uint16_t port;
  struct ssl_ctx_st *tls;  /* the customer port's TLS context, or NULL (plain HTTP); new connections
                            * take it, each keeping the one it began with (a reload swaps it) */
  int64_t tls_not_after;   /* its certificate's notAfter, seconds since the epoch (0: none) */
  struct evhttp *ops_http; /* the operator port: /healthz, /metrics */
  uint16_t ops_port;
  lt_bus_producer_t *producer;
  struct lt_api_pending *pendings; /* records waiting for the broker (lt_api_feed.c) */
  bool closing;                    /* lt_api_destroy began: new requests answer 503 */
  lt_bus_consumer_t *consumer;
  struct event *consumer_ev, *tick_ev;
  lt_proj_t *proj;
  lt_keyring_t *keyring;
  lt_avro_registry_t *own_registry; /* when conf.registry was NULL */
  const lt_avro_registry_t *reg;
  lt_avro_record_t *rec_submit, *rec_cancel;
  char topic_jobs[128], topic_control[128];
  bool ready;
  lt_map_t *history;       /* job_id -> the SSE replay buffer (lt_api_events.c) */
  int64_t pruned_at_ms;    /* when the buffers were last pruned (monotonic) */
  int64_t sse_beat_at_ms;  /* when the open event streams last got a keepalive (monotonic) */
  lt_map_t *datasets_seen; /* set of "tenant/dataset": known to exist (skips a store HEAD) */
  lt_map_t *stored_bytes;  /* tenant -> its stored bytes as last measured (lt_api_quota.c) */
  uint64_t stored_marks;   /* the last lt_api_stored_mark() (atomic: pool threads take marks) */
  uint64_t stored_floor;   /* a measure begun before this mark is not kept (a forget found no memory) */
  lt_map_t *usage_flight;  /* tenant -> its GET /v1/usage measure in flight, with the requests waiting */
  lt_map_t *submitting;    /* job_id -> tenant: submissions sent to the broker and not yet
                              acknowledged, which the queue quota counts (lt_api_jobs.c) */
  lt_map_t *saving;        /* tenant -> its session calls that save a state, taken and not yet
                              completed, which the storage quota counts (lt_api_sessions.c) */
  lt_map_t *cancels_sent;  /* set of job_id: this API wrote a CancelRequested (idempotent cancel
                              before its consumer reads the record back) */
  lt_bus_tp_t *feed_parts; /* every partition the projection folds, with its high watermark at start */
  int64_t *feed_low;       /* and the oldest offset each kept at start (retention moves it) */
  size_t nfeed;
  char waiting_for[192];   /* while not ready: the first partition behind its start-up watermark */
  char (*feed_names)[128];
  lt_api_sse_t *sse;       /* open event streams */
  lt_api_upload_t *uploads;
  lt_api_pool_t *pool;          /* NULL: blocking work runs inline (conf.work_threads < 0) */
  lt_api_download_t *downloads; /* artifact downloads in progress */
  int ndownloads;
  lt_api_stats_t stats;
  /* the lockbox (lt_api_access.c) */
  lt_access_table_t *access;
  lt_access_staff_t *staff;
  lt_avro_decoder_t *audit_dec;
  lt_recmac_key_t *audit_mac;       /* NULL without a master key: access records are refused */
  lt_avro_record_t *rec_access[5];  /* AccessRequested, Approved, Denied, Revoked, Used */
  char topic_audit[128];
  struct lt_api_audit_wait *audit_waits; /* own records waiting for the feed (lt_api_access.c) */
  int64_t *audit_next;                   /* per audit partition: the next offset the feed folds */
  size_t naudit_next;
  lt_map_t *buckets;       /* "key:ID", "tenant:ID", "addr:A" -> token bucket (lt_api_limits.c) */
  lt_map_t *conns;         /* "%p" of an evhttp_connection -> lt_api_conn_t: open customer connections */
  lt_api_conn_t *conns_new; /* accepted, not yet attached (lt_api_limits.c) */
  struct event *conns_ev;  /* attaches conns_new on the next turn of the loop */
  bool rewriting;          /* an output buffer is being rewritten (no re-entry) */
  /* training sessions (lt_api_sessions.c) */
  lt_map_t *sessions;          /* job_id -> what its calls did, folded from PrimitiveCompleted */
  lt_map_t *early_results;     /* job_id -> PrimitiveCompleted read before its session (lt_api_sessions.c) */
  size_t nearly_results;
  int64_t ready_at_ms;         /* monotonic: when the feed caught up (ready) */
  lt_avro_decoder_t *result_dec; /* and decodes them once it is */
  lt_map_t *wakes;             /* set of "job:parked_seq": SessionWoken written for that park */
  lt_api_waiter_t *waiters;    /* long polls on calls */
  lt_avro_record_t *rec_call;  /* SessionCall */
  lt_avro_decoder_t *call_dec; /* lathe.calls as the feed reads it (keyed calls, lt_api_sessions.c) */
  char topic_calls[128];
  int64_t done_offset;         /* the offset of the record whose lt_api_done_fn is running */
  int32_t done_partition;      /* and its partition */
  char topic_usage[128];       /* SamplingUsage (lt_api_sample.c) */
  lt_map_t *adapters_refused;  /* adapter id -> why it can never be served here (too large, invalid) */
};

/* ---------------------------------------------------------------- routes (lt_api.c) */

/* One request as the router hands it to a handler: the path's parts, and what the route
 * family's resolver found for {id} (the handler runs only when that exists). */
typedef struct lt_api_call {
  lt_api_t *api;
  struct evhttp_request *req;
  const lt_tenant_t *tenant; /* authenticated; NULL on public and staff routes */
  char key_id[LT_TENANT_KEY_ID_LEN + 1]; /* the id of the tenant's key that authenticated */
  const char *staff;         /* the staff member on /v1/staff routes, else NULL */
  const char *id;            /* {id}: job, dataset or upload; "" on collection routes */
  const char *name;          /* {name}: the artifact's name (the rest of the path) */
  int part;                  /* {n}: an upload's part number (0 when the path has none) */
  const lt_job_t *job;       /* /v1/jobs/{id}: the tenant's job */
  json_t *meta;              /* /v1/datasets/{id}: the dataset's meta; a handler that keeps it
                                sets this to NULL, else the router releases it */
  lt_api_upload_t *upload;   /* /v1/uploads/{id}: the tenant's open upload */
  bool openai;               /* an OpenAI-compatible route: answers take its shapes (lt_api_openai.c) */
} lt_api_call_t;

typedef void lt_api_handler_fn(lt_api_call_t *c);

/* How the router reads a decoded path under a method, before it looks at who asks: the route
 * family, the path's parts as that family spells them, and the route. Pure: no request, no
 * reply (the router's first step; tests/fuzz drives it with any bytes). */
typedef struct lt_api_match {
  int family;             /* index of the route family, -1 when the path is under none (404) */
  const char *prefix;     /* the family's prefix ("/v1/jobs"), NULL when none */
  bool parsed;            /* the rest of the path names something the family has (else 404) */
  char pattern[128];      /* the route pattern the path has, e.g. "/v1/jobs/{id}/cancel" */
  char id[LT_ID_MAX + 1]; /* {id}; "" on the collection */
  char name[128];         /* {name}: the rest of the path */
  int part;               /* {n} */
  lt_api_handler_fn *handler; /* the route of the pattern and method; NULL: 404 or 405 */
} lt_api_match_t;
void lt_api_match(const char *path, int method, lt_api_match_t *m);

/* How a job is shown: lt_api_job_json (the native API) or the OpenAI-compatible view. New ref. */
typedef json_t *lt_api_job_view_fn(lt_api_t *api, const lt_job_t *j);

/* Looks up {id} for a route family; when it does not exist, replies (404) and returns false. */
typedef bool lt_api_resolve_fn(lt_api_call_t *c);

/* ---------------------------------------------------------------- replies (lt_api_reply.c) */

/* Replies with a JSON body (takes the reference) and the given status. */
void lt_api_reply_json(struct evhttp_request *req, int status, json_t *body);
/* The body as lt_api_reply_json writes it (takes body; caller frees; NULL when it cannot), on any
 * thread: a large body is written on the pool, not the event loop. */
char *lt_api_json_text(json_t *body);
/* Sends text (from lt_api_json_text; taken, freed) as a JSON reply. */
void lt_api_reply_text(struct evhttp_request *req, int status, char *text);
/* The error object {"code","message","field","type","param"}: type is OpenAI's for the status
 * (invalid_request_error, authentication_error, not_found_error, rate_limit_error,
 * server_error, ...), param repeats field. New reference. */
json_t *lt_api_error_json(int status, const char *code, const char *field, const char *msg);
/* Replies {"error": lt_api_error_json(...)}; field may be NULL. */
void lt_api_reply_error(struct evhttp_request *req, int status, const char *code, const char *field,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Maps an lt_err_t to a status and code and replies with msg. */
void lt_api_reply_err(struct evhttp_request *req, lt_err_t err, const char *field, const char *msg);
/* A store failure, answered in msg, the caller's own words: a retriable one is 503
 * (unavailable), a missing object 404, anything else 500 (the store refusing this service's
 * credentials is not the client's key: never 401). */
void lt_api_reply_store_err(struct evhttp_request *req, lt_err_t err, const char *msg);
/* The same where the store's own message is at hand: it names the store's host, object keys or
 * access key, so it goes to the log, and the client gets `what`. */
void lt_api_reply_store_fail(struct evhttp_request *req, lt_err_t err, const char *what, const char *store_msg);

/* A failure reason as a customer may read it, into out: server paths become "(path)", worker
 * ids and this host's name (hostnames) "(worker)" and "(host)". */
void lt_api_scrub(lt_api_t *api, const char *in, char *out, size_t n);

/* The request body as a NUL-terminated string (NULL when over max_json_body: replied 413). */
char *lt_api_body_text(lt_api_t *api, struct evhttp_request *req, size_t *len);

/* Parses the request's query string into q (release with evhttp_clear_headers). */
void lt_api_parse_query(struct evhttp_request *req, struct evkeyvalq *q);
/* Value of a query parameter (borrowed from q), or NULL. */
const char *lt_api_query(struct evkeyvalq *q, const char *name);

/* ---------------------------------------------------------------- the front door (lt_api_limits.c) */

/* Puts the front door on a listener: every connection's answers pass through the rewrite of
 * libevent's own HTML error pages; with track, connections are counted against
 * max_connections. */
lt_err_t lt_api_door_open(lt_api_t *api, struct evhttp *http, bool track, char *errstr, size_t n);
/* Whether tenant may hold one more request open (a long poll of a session's call, an event
 * stream): a quarter of max_connections per tenant, so that one tenant's held requests cannot take
 * every connection; false after replying 429 (Retry-After) naming the limit. */
bool lt_api_hold_room(lt_api_t *api, struct evhttp_request *req, const char *tenant);
int lt_api_sessions_waiting_of(lt_api_t *api, const char *tenant); /* its long polls */
int lt_api_events_streams_of(lt_api_t *api, const char *tenant);   /* its event streams */
/* False (after replying 503) when the request came on a connection over max_connections. */
bool lt_api_door_admit(lt_api_t *api, struct evhttp_request *req);
/* The per-address limit on failed authentications: false (after replying 429) when the request's
 * address has used its allowance; fail true takes one attempt from it. */
bool lt_api_door_addr(lt_api_t *api, struct evhttp_request *req, bool fail);
/* The per-key and per-tenant limits: false after replying 429. */
bool lt_api_door_tenant(lt_api_t *api, struct evhttp_request *req, const char *tenant_id, const char *key_id);
/* A request its handler answers later (a submission waits for the broker's acknowledgement):
 * /metrics counts it with the status actually sent, when the reply goes out. false when req has
 * no connection record (then count it now). */
bool lt_api_door_count_later(lt_api_t *api, struct evhttp_request *req, lt_api_slot_t slot, int64_t t0_us);

/* Calls fn(arg) when the connection closes (one per connection; fn NULL clears). False when the
 * connection is not known (out of memory when it opened): then nothing will call fn. */
bool lt_api_door_on_close(lt_api_t *api, struct evhttp_connection *evcon, void (*fn)(void *), void *arg);
/* From an fn above: lets go of req, the unfinished request of the closing connection. A client
 * that leaves a started reply (a stream) makes libevent detach the request and leave it to its
 * owner, which frees it by ending it; at shutdown it is still attached and goes with the
 * connection. Either way req must not be used after this. */
void lt_api_door_release(struct evhttp_request *req);
/* Bytes written to a connection its client has not taken: in the connection's output buffer and
 * in the socket's send queue (a stream's client that reads nothing makes both grow). */
size_t lt_api_unread_bytes(struct evhttp_connection *evcon);
/* Forgets idle, full buckets (from the tick). */
void lt_api_door_tick(lt_api_t *api);
/* At shutdown, after the last answers and before evhttp frees the connections: turns the loop
 * until every customer connection's reply went to its socket, max_ms at most (a client that
 * reads nothing is not waited for). evhttp_free drops what is still buffered. */
void lt_api_door_flush(lt_api_t *api, int max_ms);
void lt_api_door_free(lt_api_t *api);

/* ---------------------------------------------------------------- the bus (lt_api_feed.c) */

/* Produces an encoded record to a topic; calls done(api, ctx, err, msg) on the loop thread once
 * the broker answered (or the timeout passed). With fold_now (a job's first record only), the
 * bytes are folded into the projection on success, so a client reads its own new job at once;
 * every other record is folded when the consumer reads it, in log order. */
typedef void lt_api_done_fn(lt_api_t *api, void *ctx, lt_err_t err, const char *msg);
lt_err_t lt_api_produce(lt_api_t *api, const char *topic, int32_t partition, const char *key, const void *value,
                        size_t len, bool fold_now, lt_api_done_fn *done, void *ctx);
/* lt_api_produce with record headers (borrowed for the call). */
lt_err_t lt_api_produce_h(lt_api_t *api, const char *topic, int32_t partition, const char *key, const void *value,
                          size_t len, const lt_bus_header_t *headers, size_t nheaders, bool fold_now,
                          lt_api_done_fn *done, void *ctx);

/* Starts the bus side: the producer, then the consumer assigned every partition of the folded
 * topics from the beginning, registered on the loop with the 200 ms tick (which also ages
 * uploads). */
lt_err_t lt_api_feed_start(lt_api_t *api, char *errstr, size_t n);
/* At shutdown, before evhttp frees the requests: every record still waiting for the broker gets
 * its answer now — from its delivery report when the broker gives one within
 * produce_timeout_ms, else as at its deadline (503) — so that no reply goes out later on a freed
 * request. A done function that writes another record (a staff read's AccessUsed, then the read)
 * is waited for too, a few rounds at most. */
void lt_api_feed_settle(lt_api_t *api);

/* ---------------------------------------------------------------- /metrics (lt_api_metrics.c) */

void lt_api_metrics_reply(lt_api_call_t *c);
/* Counts one answered request: its family, status and time to the handler's answer. */
void lt_api_metrics_observe(lt_api_t *api, lt_api_slot_t slot, int status, int64_t us);

/* ---------------------------------------------------------------- the pool (lt_api_work.c) */

/* work runs on a pool thread and touches only ctx; after runs next on the loop thread, replies
 * and frees ctx. tenant: whose task it is (fair share of the threads). */
typedef void lt_api_work_fn(void *ctx);
typedef void lt_api_after_fn(lt_api_t *api, void *ctx);
void lt_api_work(lt_api_t *api, const char *tenant, lt_api_work_fn *work, lt_api_after_fn *after, void *ctx);
/* Starts conf.work_threads threads (none when negative). */
lt_err_t lt_api_work_start(lt_api_t *api, char *errstr, size_t n);
/* Runs every queued task to the end, answers them, joins the threads. Before evhttp_free. */
void lt_api_work_stop(lt_api_t *api);

/* ---------------------------------------------------------------- downloads (lt_api_download.c) */

/* Streams the sealed object at key to req, decrypted with the key wrapped at dek_key (a job's
 * artifact key, a dataset's key) or, when there is none and not own_key, with dek (borrowed: the
 * keyring's tenant key; own_key: a missing key or object answers 404), in pieces:
 * memory stays at a few pieces whatever the object's size. bytes: its plaintext size
 * (Content-Length). Replies 429 beyond conf.max_downloads streams at once. job: the job whose
 * artifact it is (NULL for a dataset): once the API folds its JobDeleted, the connection is cut. */
void lt_api_download_start(lt_api_t *api, struct evhttp_request *req, const lt_crypto_dek_t *dek, const char *dek_key,
                           bool own_key, const char *key, uint64_t bytes, const char *content_type, const char *job);
/* A staff read's grant: the stream lasts only while it holds (lt_api_download_recheck). */
typedef struct {
  char request_id[LT_ID_MAX + 1];
  char staff[LT_ACCESS_PRINCIPAL_LEN];
  char resource[LT_ACCESS_SCOPE_LEN];
} lt_api_grant_t;
/* lt_api_download_start under grant g (copied): a piece goes out only while g holds; once it is
 * revoked or runs out, the connection is cut, short of its Content-Length. */
void lt_api_download_start_granted(lt_api_t *api, struct evhttp_request *req, const lt_crypto_dek_t *dek,
                                   const char *dek_key, bool own_key, const char *key, uint64_t bytes,
                                   const char *content_type, const char *job, const lt_api_grant_t *g);
/* Cuts each staff read whose grant no longer holds, and each download of a deleted job's artifact
 * (after the feed folds an access record or a JobDeleted, and on the tick: a grant runs out on
 * its own). */
void lt_api_download_recheck(lt_api_t *api);
/* Cuts each download of the object at key (a dataset deleted by this API). */
void lt_api_download_cut_object(lt_api_t *api, const char *key);
/* Whether tenant may start a download now (under max_downloads, and a quarter of it per tenant),
 * or, staff not NULL, staff member staff a read of tenant's data (a quarter per staff member: the
 * tenant's own downloads do not count, so a refusal tells staff nothing of them); when not,
 * answers 429 with Retry-After. */
bool lt_api_download_room(lt_api_t *api, struct evhttp_request *req, const char *tenant, const char *staff);
/* Stops every download (the connections are dropped), joins their threads. Before evhttp_free. */
void lt_api_download_stop_all(lt_api_t *api);

/* ---------------------------------------------------------------- storage quota (lt_api_quota.c) */

/* Plaintext bytes of the tenant's published artifacts (deleted jobs not counted). Loop thread. */
uint64_t lt_api_artifact_bytes(lt_api_t *api, const char *tenant);
/* Stored bytes of the tenant's datasets, checkpoints (staging) and session call bodies and
 * results, listed from the store; *since: the mark (lt_api_stored_mark) taken as the listing
 * began, for lt_api_stored_note; *ckpt_max (may be NULL): the bytes of its largest checkpoint
 * (one staging directory). Any thread. */
lt_err_t lt_api_stored_bytes(lt_api_t *api, const char *tenant, uint64_t *out, uint64_t *since, uint64_t *ckpt_max,
                             char *msg, size_t n);
/* A measure of lt_api_stored_bytes is trusted this long by a submission's check. */
#define LT_API_STORED_FRESH_MS 60000
/* A mark: a number larger than every mark taken before it. Any thread. */
uint64_t lt_api_stored_mark(lt_api_t *api);
/* Remembers the tenant's stored bytes measured from mark `since`, unless a measure begun after
 * `since`, or a change, was noted since; measured false forgets them (its bytes changed: measured
 * again when asked), and every measure begun before it. Loop thread. */
void lt_api_stored_note(lt_api_t *api, const char *tenant, uint64_t since, bool measured, uint64_t bytes);
/* The tenant's stored bytes as measured within LT_API_STORED_FRESH_MS, and how long ago (age_ms
 * may be NULL); false when none is. */
bool lt_api_stored_recent(lt_api_t *api, const char *tenant, uint64_t *bytes, int64_t *age_ms);
/* Tenant t's storage quota: its own quotas.max_storage_bytes where set (> 0), else the API's
 * conf.max_storage_bytes; 0: no limit. Loop thread (it reads the tenant's record). */
uint64_t lt_api_storage_quota(const lt_api_t *api, const lt_tenant_t *t);
/* LT_ERR_QUOTA naming quota and usage when adding bytes would take the tenant over quota
 * (adding 0: when it is at or over it already; why, or NULL for a job's artifacts, says what
 * would add to it); quota 0: never. */
lt_err_t lt_api_storage_check(uint64_t quota, const char *tenant, uint64_t datasets, uint64_t artifacts,
                              uint64_t adding, const char *why, char *msg, size_t n);
/* 413 storage_quota_exceeded with msg. */
void lt_api_reply_storage(struct evhttp_request *req, const char *msg);
/* What the quotas count of a tenant's jobs: those not ended, sessions among them
 * (max_queued_jobs), and those dispatched, running or stopping with their slots
 * (max_running_slots). Loop thread. */
typedef struct lt_api_jobs_count {
  int64_t live, sessions, running, slots;
} lt_api_jobs_count_t;
lt_api_jobs_count_t lt_api_tenant_jobs(lt_api_t *api, const char *tenant);
/* GET /v1/usage: the tenant's quotas and its use of each. */
void lt_api_usage(lt_api_call_t *c);

/* ---------------------------------------------------------------- jobs (lt_api_jobs.c) */

bool lt_api_jobs_resolve(lt_api_call_t *c);
void lt_api_jobs_submit(lt_api_call_t *c);
/* Names, admits and records a spec read elsewhere (a session's: lt_api_sessions.c). */
void lt_api_jobs_submit_spec(lt_api_call_t *c, lt_jobspec_t *spec);
/* A page of the caller's jobs (sessions) newest first, each shown by view, from the query's
 * limit, state and after (or cursor). LT_ERR_INVALID after replying 400. */
/* True (after replying 400 naming field) when the fleet has said which base models it serves and
 * model is none of them. */
bool lt_api_model_unserved(lt_api_t *api, struct evhttp_request *req, const char *model, const char *field);
lt_err_t lt_api_jobs_page(lt_api_call_t *c, struct evkeyvalq *q, bool sessions, lt_api_job_view_fn *view,
                          json_t **data, bool *more);
/* A job as GET /v1/jobs/{id} shows it. New reference. */
json_t *lt_api_job_json(lt_api_t *api, const lt_job_t *j);
void lt_api_jobs_list(lt_api_call_t *c);
void lt_api_jobs_show(lt_api_call_t *c);
void lt_api_jobs_cancel(lt_api_call_t *c);
void lt_api_jobs_delete(lt_api_call_t *c); /* lt_api_delete.c */
/* True once the job's JobDeleted was folded (lt_api_delete.c). */
bool lt_api_job_deleted(lt_api_t *api, const char *job_id);
/* c->job ("job" or "session", what) was deleted and the request is not the DELETE that finishes it:
 * 410 is answered, true. */
bool lt_api_job_gone(lt_api_call_t *c, const char *what);
/* DELETE /v1/sessions/{id}: its end, or with purge=true a finished session deleted (lt_api_delete.c). */
void lt_api_sessions_delete(lt_api_call_t *c);
void lt_api_jobs_checkpoints(lt_api_call_t *c); /* the committed checkpoints, oldest first */
void lt_api_jobs_artifacts(lt_api_call_t *c); /* the list, or one artifact's bytes with {name} */

/* ---------------------------------------------------------------- events (lt_api_events.c) */

void lt_api_events_stream(lt_api_call_t *c);
/* ---------------------------------------------------------------- sessions (lt_api_sessions.c) */
lt_err_t lt_api_sessions_start(lt_api_t *api, char *errstr, size_t n);
void lt_api_sessions_free(lt_api_t *api); /* answers nothing: the connections are going */
bool lt_api_is_session_id(const char *id);
bool lt_api_sessions_resolve(lt_api_call_t *c);
void lt_api_sessions_create(lt_api_call_t *c);
void lt_api_sessions_list(lt_api_call_t *c); /* lt_api_jobs.c: the jobs' pages */
void lt_api_sessions_show(lt_api_call_t *c);
void lt_api_sessions_end(lt_api_call_t *c);
void lt_api_sessions_call(lt_api_call_t *c);
void lt_api_sessions_call_show(lt_api_call_t *c);
void lt_api_tokenize(lt_api_call_t *c);
void lt_api_detokenize(lt_api_call_t *c);
/* A PrimitiveCompleted the projection read; a job record (the end of a session wakes its polls). */
void lt_api_sessions_on_record(lt_api_t *api, const lt_proj_result_t *res);
void lt_api_saving_free(void *v); /* a saving map value */
/* Whether call seq of the session has its answer here, or is a later record of a keyed call (its
 * worker skips it): it will write nothing more. */
bool lt_api_sessions_call_settled(lt_api_t *api, const char *job_id, int64_t seq);
/* The saving calls in flight of a tenant with a storage quota (lt_api_quota.c): its object of them
 * (created when asked), pruned of those that will write nothing more (their count; *bytes, may
 * be NULL: what their checkpoints write at least), and one read back from lathe.calls. */
json_t *lt_api_saving_of(lt_api_t *api, const char *tenant, bool create);
/* The bytes a checkpoint of session j writes at least (its base model's config and adapter); 0
 * when not known here. */
uint64_t lt_api_session_ckpt_bytes(lt_api_t *api, const lt_job_t *j);
uint32_t lt_api_saving_prune(lt_api_t *api, const char *tenant, uint64_t *bytes);
void lt_api_saving_note(lt_api_t *api, const char *tenant, const char *job_id, const char *body_key, int64_t seq);
/* A record of lathe.calls: which call a keyed call id (Idempotency-Key) named first. */
void lt_api_sessions_on_call(lt_api_t *api, const lt_bus_msg_t *m);
void lt_api_sessions_on_job(lt_api_t *api, const char *job_id);
/* The feed caught up: each parked session with a call after its park read here is woken. */
void lt_api_sessions_on_ready(lt_api_t *api);
/* The key of the state file a live session saved under name (save_state or
 * save_weights_for_sampler; its adapter files lie beside it), and the checkpoint's number; NULL
 * when the session saved none by that name. Borrowed until the next record is folded. */
const char *lt_api_sessions_saved(lt_api_t *api, const char *job_id, const char *name, int64_t *checkpoint);
/* The names of the states a session saved (a new JSON array of strings). */
json_t *lt_api_sessions_saved_names(lt_api_t *api, const char *job_id);
/* Forgets what the calls of sessions that ended over an hour ago did (their results are deleted
 * by then: the publisher's GC); a call of such a session then answers "session_ended". */
void lt_api_sessions_prune(lt_api_t *api);
/* ---------------------------------------------------------------- sampling (lt_api_sample.c) */
lt_err_t lt_api_sample_start(lt_api_t *api, char *errstr, size_t n);
bool lt_api_sample_resolve(lt_api_call_t *c); /* the sampling routes (and /v1/usage) have no {id} */
void lt_api_sample_completions(lt_api_call_t *c);
void lt_api_sample_chat(lt_api_call_t *c);
void lt_api_sample_models(lt_api_call_t *c);
/* The job's adapters out of the sampler beside this API (its cache ids are "tenant/job"), zeroed;
 * nothing without a sampler. */
void lt_api_sample_forget(lt_api_t *api, const char *tenant_id, const char *job_id);
/* ---------------------------------------------------------------- events (lt_api_events.c) */
/* Called for every record the projection folded that concerns a job (SSE fan-out). */
void lt_api_events_on_record(lt_api_t *api, const lt_proj_result_t *res);
void lt_api_events_free(lt_api_t *api); /* detaches open streams */
/* Forgets the replay buffers of jobs that ended over conf.sse_keep_ended_ms ago. */
void lt_api_events_prune(lt_api_t *api);
void lt_api_history_free(void *hist);   /* a history map value */

/* ---------------------------------------------------------------- datasets (lt_api_datasets.c) */

bool lt_api_uploads_resolve(lt_api_call_t *c);
void lt_api_uploads_open(lt_api_call_t *c);
void lt_api_uploads_part(lt_api_call_t *c);
void lt_api_uploads_complete(lt_api_call_t *c);
void lt_api_uploads_abort(lt_api_call_t *c);
void lt_api_uploads_tick(lt_api_t *api); /* aborts idle uploads */
void lt_api_uploads_free(lt_api_t *api);

bool lt_api_datasets_resolve(lt_api_call_t *c);
void lt_api_datasets_upload(lt_api_call_t *c); /* one request: open, one part, complete */
void lt_api_datasets_list(lt_api_call_t *c);
void lt_api_datasets_show(lt_api_call_t *c);
void lt_api_datasets_delete(lt_api_call_t *c);

/* ---------------------------------------------------------------- the lockbox (lt_api_access.c) */

lt_err_t lt_api_access_start(lt_api_t *api, char *errstr, size_t n); /* before the feed starts */
void lt_api_access_free(lt_api_t *api);
void lt_api_access_on_record(lt_api_t *api, const lt_bus_msg_t *m); /* a lathe.audit record */
void lt_api_access_settle(lt_api_t *api); /* answers 503 what waits for the feed: the API stops */

/* ---------------------------------------------------------------- early answers (lt_api_early.c) */

/* A session's PrimitiveCompleted (its bytes) read before the session: kept until it is known. */
void lt_api_early_keep(lt_api_t *api, const char *job_id, const void *bytes, size_t len);
/* job_id is known now: what was kept for it is folded (lt_api_sessions_on_record, and the events). */
void lt_api_early_release(lt_api_t *api, const char *job_id);
/* Drops what was kept for sessions still unknown a minute after the feed caught up. */
void lt_api_early_prune(lt_api_t *api);
lt_err_t lt_api_early_start(lt_api_t *api, char *errstr, size_t n);
void lt_api_early_free(lt_api_t *api);
/* The staff member a staff key names, or NULL (replied 401). */
const char *lt_api_staff_authenticate(lt_api_t *api, struct evhttp_request *req);
bool lt_api_access_resolve(lt_api_call_t *c);
void lt_api_access_list(lt_api_call_t *c);
void lt_api_access_show(lt_api_call_t *c);
void lt_api_access_approve(lt_api_call_t *c);
void lt_api_access_deny(lt_api_call_t *c);
void lt_api_access_revoke(lt_api_call_t *c);
bool lt_api_staff_access_resolve(lt_api_call_t *c);
void lt_api_staff_access_request(lt_api_call_t *c);
void lt_api_staff_access_list(lt_api_call_t *c);
void lt_api_staff_access_show(lt_api_call_t *c);
void lt_api_staff_access_approve(lt_api_call_t *c);
void lt_api_staff_access_revoke(lt_api_call_t *c);
void lt_api_staff_access_read_dataset(lt_api_call_t *c);
void lt_api_staff_access_read_artifact(lt_api_call_t *c);

/* Whether a tenant's dataset exists, in three parts so that the store is asked off the loop (a
 * submission, a staff read under a grant): whether this API has seen it exist (a valid id, loop
 * thread); the store's answer (any thread: a pool task): LT_OK when its meta object is in the
 * store, LT_ERR_NOT_FOUND when it is not (or the id is no id), another code when the store could
 * not say (unreachable), and the caller then answers 503 (lt_api_reply_store_unsure), never a 404
 * that tells a client its dataset is gone while the store restarts; noting that it exists (loop
 * thread). */
bool lt_api_dataset_seen(lt_api_t *api, const char *tenant, const char *dataset_id);
lt_err_t lt_api_dataset_head(lt_api_t *api, const char *tenant, const char *dataset_id);
/* The dataset's key (unwrapped) and its metadata (id, name, bytes, report), read from the store
 * (any thread: the work pool); *dek and *meta are the caller's. */
lt_err_t lt_api_dataset_open(lt_api_t *api, const char *tenant, const char *id, lt_crypto_dek_t **dek, json_t **meta,
                             char *msg, size_t n);
void lt_api_dataset_mark_seen(lt_api_t *api, const char *tenant, const char *dataset_id);

/* 503 "unavailable" with Retry-After, naming field (may be NULL): the store could not say whether
 * the tenant's dataset id exists (err: lt_api_dataset_head's); retrying is safe. */
void lt_api_reply_store_unsure(struct evhttp_request *req, const char *field, const char *id, lt_err_t err);

/* ---------------------------------------------------------------- OpenAI-compatible (lt_api_openai.c) */

/* What the OpenAI routes parse, pure (no request, no reply), for the handlers and tests/fuzz: */
#define LT_API_FIELD_MAX 256 /* the "field" of an error, as long as a refused key may be */
/* The value of a parameter (boundary=...) of a Content-Type header, unquoted, into out (n bytes);
 * false when h has none or it does not fit. */
bool lt_api_header_param(const char *h, const char *name, char *out, size_t n);
/* One part of a multipart/form-data body. */
typedef struct lt_api_form_part {
  char name[64];
  char filename[512]; /* as long as a header line read: a longer name is refused, not dropped */
  const char *data; /* into the body */
  size_t len;
} lt_api_form_part_t;
/* Splits body (len bytes, need not be NUL-terminated) at the boundary into at most max parts;
 * false when it is not a well-formed multipart body. The parts point into body. */
bool lt_api_form_parse(const char *body, size_t len, const char *boundary, lt_api_form_part_t *parts, int max,
                       int *count);
/* POST /v1/fine_tuning/jobs's body (len bytes) as a validated job spec; false with the field (in
 * OpenAI's words, "" when none) and the message of the 400 when it is refused. */
bool lt_api_openai_job_spec(const char *text, size_t len, lt_jobspec_t *spec, char *field, size_t field_size,
                            char *msg, size_t msg_size);
void lt_api_openai_files_create(lt_api_call_t *c);      /* POST /v1/files (multipart) */
void lt_api_openai_jobs_create(lt_api_call_t *c);       /* POST /v1/fine_tuning/jobs */
void lt_api_openai_jobs_list(lt_api_call_t *c);         /* GET /v1/fine_tuning/jobs */
void lt_api_openai_jobs_show(lt_api_call_t *c);         /* GET /v1/fine_tuning/jobs/{id} */
void lt_api_openai_jobs_events(lt_api_call_t *c);       /* GET .../{id}/events */
void lt_api_openai_jobs_checkpoints(lt_api_call_t *c);  /* GET .../{id}/checkpoints */
/* OpenAI's fine_tuning.job object of a job, and file object of a dataset's meta. New refs. */
json_t *lt_api_openai_job_json(lt_api_t *api, const lt_job_t *j);
json_t *lt_api_openai_file_json(const json_t *meta);
/* A dataset upload of body (taken) named name (NULL: its id), answered as c->openai says. */
void lt_api_datasets_upload_body(lt_api_call_t *c, const char *name, struct evbuffer *body);
/* The job's kept event history [{id, event, data}], oldest first (borrowed), or NULL. */
json_t *lt_api_events_history(lt_api_t *api, const char *job_id);
/* ": keepalive" on every open event stream (the feed's tick calls it every 15 s). */
void lt_api_events_heartbeat(lt_api_t *api);
/* Cuts the event streams whose key no longer authenticates (revoked, its tenant disabled or
 * gone): from the tick, so within a tick of the API folding the tenant's record. */
void lt_api_events_recheck(lt_api_t *api);

#endif
