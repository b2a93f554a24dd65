/* lt_api_int: what the API's files share (lt_api.c: server, routing, projection feed;
 * lt_api_jobs.c: jobs and events; lt_api_datasets.c: uploads and datasets). Not public. */
#ifndef LT_API_INT_H
#define LT_API_INT_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdbool.h>

#include "lt_api.h"
#include "lt_proj.h"
#include "lt_sealed.h"
#include "lt_tenant.h"

#define LT_API_PART_MAX (8u << 20) /* largest upload part (and single-request dataset) */

typedef struct lt_api_upload lt_api_upload_t;
typedef struct lt_api_sse lt_api_sse_t;
typedef struct lt_api_pending lt_api_pending_t;

/* Counters for /metrics, by route family and status class. */
typedef struct lt_api_stats {
  uint64_t requests[8][5]; /* [route][status/100 - 1] */
  uint64_t latency_us_sum[8];
  uint64_t latency_le[8][10]; /* histogram buckets, see lt_api.c */
  uint64_t produced, produce_failed, deadlettered, undecodable;
} lt_api_stats_t;

struct lt_api {
  lt_api_conf_t conf;
  struct event_base *base;
  struct evhttp *http;
  uint16_t port;
  lt_bus_producer_t *producer;
  lt_bus_consumer_t *consumer;
  struct event *consumer_ev, *tick_ev;
  lt_proj_t *proj;
  lt_keyring_t *keyring;
  lt_avro_registry_t *own_registry; /* when conf.registry was NULL */
  const lt_avro_registry_t *reg;
  lt_avro_record_t *rec_submit, *rec_cancel;
  char topic_jobs[128], topic_control[128];
  bool ready;
  json_t *history;         /* job_id -> [ {id, event, data} ], the SSE replay buffer */
  json_t *datasets_seen;   /* "tenant/dataset" -> true: known to exist (skips a store HEAD) */
  json_t *cancels_sent;    /* job_id -> true: this API wrote a CancelRequested (idempotent cancel
                              before its consumer reads the record back) */
  lt_bus_tp_t *feed_parts; /* every partition the projection folds, with its high watermark at start */
  size_t nfeed;
  char (*feed_names)[128];
  lt_api_sse_t *sse;       /* open event streams */
  lt_api_upload_t *uploads;
  lt_api_stats_t stats;
};

/* Replies with a JSON body (takes the reference) and the given status. */
void lt_api_reply_json(struct evhttp_request *req, int status, json_t *body);
/* Replies {"error":{"code","message","field"}}; field may be NULL. */
void lt_api_reply_error(struct evhttp_request *req, int status, const char *code, const char *field,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Maps an lt_err_t to a status and code and replies with msg. */
void lt_api_reply_err(struct evhttp_request *req, lt_err_t err, const char *field, const char *msg);

/* The request body as a NUL-terminated string (NULL when over max_json_body: replied 413). */
char *lt_api_body_text(lt_api_t *api, struct evhttp_request *req, size_t *len);

/* Value of a query parameter (borrowed from q), or NULL. */
const char *lt_api_query(struct evkeyvalq *q, const char *name);

/* Produces an encoded record to a topic; calls done(api, ctx, err, msg) on the loop thread once
 * the broker answered (or the timeout passed). With fold_now (a job's first record only), the
 * bytes are folded into the projection on success, so a client reads its own new job at once;
 * every other record is folded when the consumer reads it, in log order. */
typedef void lt_api_done_fn(lt_api_t *api, void *ctx, lt_err_t err, const char *msg);
lt_err_t lt_api_produce(lt_api_t *api, const char *topic, int32_t partition, const char *key, const void *value,
                        size_t len, bool fold_now, lt_api_done_fn *done, void *ctx);

/* Route handlers. tenant is authenticated; rest is the path after the route prefix. */
void lt_api_jobs_route(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *tenant, const char *rest);
void lt_api_datasets_route(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *tenant,
                           const char *rest);
void lt_api_uploads_route(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *tenant,
                          const char *rest);

/* Called for every record the projection folded that concerns a job (SSE fan-out). */
void lt_api_jobs_on_record(lt_api_t *api, const lt_proj_result_t *res);
void lt_api_jobs_free(lt_api_t *api);
void lt_api_uploads_tick(lt_api_t *api); /* aborts idle uploads */
void lt_api_uploads_free(lt_api_t *api);

/* True when the tenant's dataset exists (its meta object is in the store). */
bool lt_api_dataset_exists(lt_api_t *api, const char *tenant, const char *dataset_id);

#endif
