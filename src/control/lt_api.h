/* lt_api: `lathed api`, the customers' HTTP/JSON door (libevent evhttp).
 *
 * Stateless: it authenticates, validates, writes records, and answers reads from a projection
 * (lt_proj) it folds from the topics. It never acknowledges what is not durable: a submission or
 * cancel is answered only after the broker acknowledged the record (acks=all); when the broker
 * cannot take it the answer is 503. Two listeners:
 *
 * The operator port (operator_bind_addr, loopback by default) serves only
 *   GET    /healthz                      liveness, readiness and the projection's digest
 *   GET    /metrics                      Prometheus text (names every tenant: never for customers)
 *
 * The customer port (HTTPS when tls_cert_file is set; the operator port stays plain HTTP on its
 * loopback address) serves (all JSON; errors {"error":{"code","message","field","type","param"}}, including
 * what libevent itself refuses: 400, 413, 501):
 *   POST   /v1/datasets?name=N           JSONL body, streamed: validated, encrypted, stored
 *   GET    /v1/datasets                  the tenant's datasets
 *   GET    /v1/datasets/{id}             one dataset's report
 *   DELETE /v1/datasets/{id}             crypto-shred (object and its wrapped key)
 *   POST   /v1/uploads?name=N            a dataset in parts: PUT /v1/uploads/{id}/parts/{n} (in order),
 *                                        POST /v1/uploads/{id}/complete; DELETE /v1/uploads/{id} aborts
 *   POST   /v1/jobs                      submit (Idempotency-Key header: same key, same job; another body: 422)
 *   GET    /v1/jobs?state=&limit=&cursor=
 *   GET    /v1/jobs/{id}                 state, attempt, queue position, wait estimate, metrics
 *   DELETE /v1/jobs/{id}                 a finished job: recorded, artifacts crypto-shredded and
 *                                        deleted with its staging objects; then 410 (lt_api_delete.c)
 *   POST   /v1/jobs/{id}/cancel          idempotent
 *   GET    /v1/jobs/{id}/events          Server-Sent Events, resumable with Last-Event-ID ("event:
 *                                        gap" first when events after it are no longer kept)
 *   GET    /v1/jobs/{id}/checkpoints     the checkpoints it committed, oldest first: attempt, step,
 *                                        bytes, final, committed_at, an evaluation's metrics at that step
 *   GET    /v1/jobs/{id}/artifacts[/{name}]  published artifacts only, decrypted for the owner
 *                                        (streamed in pieces: lt_api_download.c)
 *   POST   /v1/sessions                  a training session: {base_model, lora, seed, priority}
 *   GET    /v1/sessions, /v1/sessions/{id}   pages of them; one, with its step and saved states
 *   DELETE /v1/sessions/{id}             end it after its queued calls (its adapter is published)
 *   POST   /v1/sessions/{id}/cancel      stop it at once
 *   POST   /v1/sessions/{id}/calls       a call (forward_backward, forward, optim_step, save_state,
 *                                        load_state, save_weights_for_sampler, sample): 202 {seq}
 *   GET    /v1/sessions/{id}/calls/{seq}?wait=S  long poll for its result (lt_api_sessions.c)
 *   GET    /v1/sessions/{id}/events, /artifacts[/{name}]  as a job's
 *   POST   /v1/tokenize, /v1/detokenize  {model, text} <-> {tokens} with the base model's tokenizer
 *   POST   /v1/completions, /v1/chat/completions  OpenAI-compatible sampling from a base model or
 *                                        ft:<base>:<job-id>, streamed with stream: true (SSE)
 *   GET    /v1/models                    the base models served and the caller's own adapters
 *                                        (the sampler role: lt_api_sample.c)
 *   GET    /v1/usage                     the tenant's quotas and its use of each (lt_api_quota.c)
 *   GET    /v1/access[/{id}], POST /v1/access/{id}/approve|deny|revoke   the tenant's lockbox
 *   /v1/staff/access...                  staff's side of the lockbox (a staff key; lt_api_access.c)
 *   POST   /v1/files, GET /v1/files[/{id}], DELETE /v1/files/{id}   OpenAI's files over datasets
 *   POST   /v1/fine_tuning/jobs, GET /v1/fine_tuning/jobs[/{id}[/events|/checkpoints]],
 *   POST   /v1/fine_tuning/jobs/{id}/cancel   OpenAI's fine-tuning API over jobs (lt_api_openai.c)
 *   GET    /dashboard/[FILE]             the web dashboard's static files (lt_web.h; public)
 *
 * docs/openapi.yaml describes every route with its bodies and errors; tests/openapi_check.py
 * holds it to the routes[] table of lt_api.c.
 *
 * Threads: requests are parsed, routed and answered on the caller's event_base thread; blocking
 * work (upload validation and encryption, object-store calls) runs on a small pool of threads
 * (lt_api_work.c), each artifact download streams from a thread of its own, and the producer's
 * delivery reports come from librdkafka's; all hand results back through event_active(). The
 * process must call evthread_use_pthreads() before creating the event_base. */
#ifndef LT_API_H
#define LT_API_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_dataset.h"
#include "lt_err.h"
#include "lt_recmac.h"
#include "lt_sampling.h"
#include "lt_store.h"

typedef struct lt_api lt_api_t;

/* A token bucket: `per_s` tokens a second, at most `burst` saved up; a request takes one, and
 * one that finds none is answered 429 with Retry-After. per_s < 0: no limit. */
typedef struct lt_api_rate {
  double per_s;
  double burst;
} lt_api_rate_t;

/* Parses "R/B" (R per second, burst B >= 1), "R" (burst 2R, at least 1) or "off" into *out;
 * false when the text is none of these. */
bool lt_api_rate_parse(const char *text, lt_api_rate_t *out);

/* What /v1/tokenize answers (404, with the model's id) for a base model it has no tokenizer of. */
#define LT_API_NO_TOKENIZER "no base model \"%s\" with a tokenizer is served here"

typedef struct lt_api_conf {
  const char *bind_addr;               /* "127.0.0.1" */
  uint16_t port;                       /* 0: any free port (lt_api_port tells which) */
  const lt_bus_conf_t *bus;            /* borrowed */
  lt_store_t *store;                   /* borrowed */
  const lt_crypto_kek_t *kek;          /* borrowed: unwraps tenants' data keys */
  /* borrowed; TenantUpserted folds only with a valid MAC under it (docs/DESIGN.md §5a). lathed
   * always sets it; NULL (tests of other behaviour) folds tenants unchecked. */
  const lt_recmac_key_t *tenant_mac;
  const lt_avro_registry_t *registry;  /* borrowed */
  const char *producer_id;             /* identity in records, e.g. "api/host-1" */
  lt_dataset_tokens_fn *tokens_fn;     /* token counting for uploads; NULL: no token checks */
  void *tokens_ctx;
  /* /v1/tokenize and /v1/detokenize with a base model's tokenizer (NULL: 501): in is the text (a
   * JSON string) or the ids (an array); *out gets {"tokens": [...]} or {"text": "..."}.
   * LT_ERR_NOT_FOUND for a model with no tokenizer here (errstr: LT_API_NO_TOKENIZER with the
   * model, which a key not allowed the model is told too), LT_ERR_INVALID for bad ids. */
  lt_err_t (*tokenize_fn)(void *ctx, const char *model, const json_t *in, json_t **out, char *errstr,
                          size_t errstr_size);
  /* A base model's vocabulary size, which session calls' token ids are checked against (0 when
   * not known here: the executor checks them). */
  int (*vocab_fn)(void *ctx, const char *model);
  /* The bytes one checkpoint of a session (LoRA of rank `rank` over `targets`, LT_MODULE_* bits)
   * on a base model writes at least, which a storage quota counts a saving call as before the
   * tenant has one stored (0 when not known here). */
  uint64_t (*checkpoint_bytes_fn)(void *ctx, const char *model, int rank, unsigned targets);
  void *tokenize_ctx;
  int produce_timeout_ms;              /* how long a submission waits for the broker (5000) */
  size_t max_json_body;                /* largest JSON request body (65536) */
  uint64_t max_upload_bytes;           /* hard cap on any upload (1 GiB); tenants' quotas are lower */
  int work_threads;                    /* threads for blocking work (4); < 0: on the loop thread */
  int max_open_uploads;                /* open uploads per tenant (4); each may hold a part's bytes */
  int max_saving_calls;                /* a tenant's session calls that save a state, taken and not
                                          completed, under a storage quota (256) */
  int64_t upload_idle_ms;              /* an upload idle this long is dropped (600000) */
  int max_downloads;                   /* artifact downloads streaming at once, all tenants (16) */
  size_t download_window;              /* bytes a download holds in memory at most (1 MiB) */
  size_t stream_backlog;               /* bytes of a stream (samples, a job's events) its client left
                                        * unread before it is cut (4 MiB; lt_api_sample.c, lt_api_events.c) */
  uint64_t max_storage_bytes;          /* per tenant, datasets and artifacts together; 0: no limit */
  const char *staff_keys_file;         /* staff keys (lt_access.h); NULL: no staff can sign in */
  bool access_second_staff;            /* a staff grant also needs a second staff member's approval */
  const char *operator_bind_addr;      /* /healthz and /metrics ("127.0.0.1") */
  uint16_t operator_port;              /* 0: any free port (lt_api_operator_port tells which) */
  int max_connections;                 /* open customer connections (0: 1024); more answer 503 */
  lt_api_rate_t key_rate;              /* requests per API key ({0}: 20/s, burst 40) */
  lt_api_rate_t tenant_rate;           /* requests per tenant, all its keys ({0}: 50/s, burst 100) */
  lt_api_rate_t auth_fail_rate;        /* failed authentications per source address ({0}: 2/s, burst 30) */
  const char *tls_cert_file;           /* PEM certificate chain: the customer port speaks HTTPS */
  const char *tls_key_file;            /* its PEM private key (both NULL: plain HTTP) */
  int sse_history;                     /* events kept per job for SSE replay (0: 1024), oldest dropped */
  int64_t sse_keep_ended_ms;           /* a finished job's events are kept this long (0: 10 min) */
  /* The sampling backend (borrowed; lathed's sampler role): /v1/completions, /v1/chat/completions
   * and /v1/models (lt_api_sample.c). NULL: those routes answer 404 naming the sampler. */
  const lt_sample_ops_t *sampler;
  /* The sampler role: only the sampling routes and /v1/tokenize|detokenize are served; the rest
   * answer 404 (they are the api role's). */
  bool sampler_only;
} lt_api_conf_t;

/* Creates the server, binds, starts folding the topics from the beginning. */
lt_err_t lt_api_new(struct event_base *base, const lt_api_conf_t *conf, lt_api_t **out, char *errstr,
                    size_t errstr_size);

/* The port the server listens on for customers, and the operator port (/healthz, /metrics). */
uint16_t lt_api_port(const lt_api_t *api);
uint16_t lt_api_operator_port(const lt_api_t *api);

/* Reads the customer port's certificate and key again from conf's files (lathed: on SIGHUP), for a
 * renewed certificate without a restart: connections made from then on get it, open ones keep the
 * one they began with. Files that cannot be used leave the certificate served as it was
 * (LT_ERR_INVALID naming the file and why); LT_ERR_NOT_FOUND for an API without TLS. Loop thread. */
lt_err_t lt_api_tls_reload(lt_api_t *api, char *errstr, size_t errstr_size);

/* True once the projection caught up with the end of the topics as of start-up. */
bool lt_api_ready(const lt_api_t *api);

/* The projection's job-state digest (lt_job_digest), for replay checks. */
lt_err_t lt_api_digest(lt_api_t *api, char out_hex[65]);

void lt_api_destroy(lt_api_t *api);

#endif
