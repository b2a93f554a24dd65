/* lathed: the Lathe daemon. One binary, one role per process (or --role all in one process).
 *
 *   lathed --role api [--bind ADDR] [--port N] [--operator-bind ADDR] [--operator-port N]
 *                     [--max-connections N] [--tls-cert PEM --tls-key PEM]
 *   lathed --role scheduler [--operator-bind ADDR] [--scheduler-port N]   (or LATHE_SCHEDULER_PORT)
 *   lathed --role worker|publisher [--operator-bind ADDR] [--operator-port N]   (default: any free port)
 *   lathed --role sampler [--bind ADDR] [--port N] [--operator-port N]   OpenAI-compatible sampling
 *   lathed --role all [--port N] [--sampler-port N]  (the sampler only with --sampler-port)
 *   lathed --role all --embedded [--port N] [--data DIR]   (in memory: see lt_embedded.h)
 *   lathed --role executor        (spawned by a worker; not for people)
 *   every role: [--log-format text|json]   (or LATHE_LOG_FORMAT; lt_log.h)
 *
 * Configuration comes from the environment (`eval "$(ops/stack env)"` sets the local stack's):
 *   LATHE_KAFKA_BOOTSTRAP, LATHE_TOPIC_PREFIX        Kafka
 *   LATHE_KAFKA_CONFIG                               a file of librdkafka properties for all
 *   LATHE_KAFKA_CONFIG_DIR                           ROLE.properties: each role's principal
 *   LATHE_S3_ENDPOINT, _BUCKET, _ACCESS_KEY, _SECRET_KEY   object store (S3)
 *   LATHE_STORE_DIR                                  a local directory store instead of S3
 *   LATHE_MASTER_KEY_FILE or LATHE_MASTER_KEY        the master key that wraps data keys
 *   LATHE_INSTANCE                                   this process's name in records (hostname)
 *   LATHE_STAFF_KEYS_FILE                            api: staff keys (`lathe admin staff add`)
 *   LATHE_ACCESS_SECOND_STAFF=1                      api: grants also need a second staff approval
 *   LATHE_MODELS_DIR                                 worker: base models (default: meson option models_dir);
 *                    api: their tokenizers, and configs for a session's checkpoint bytes
 *   LATHE_WORKER_SLOTS, LATHE_WORKER_THREADS         worker: attempts at once, threads each
 *   LATHE_WORKER_BACKEND=auto|cpu|cuda               worker: what executors train on (auto: every
 *                    GPU, one a slot, where there are GPUs; the cpu otherwise)
 *   LATHE_SESSION_IDLE_MS                            worker: a session idle this long is parked (300000)
 *   LATHE_WORKER_MEM_DIR                             worker: a tmpfs for executors' plaintext (/dev/shm)
 *   LATHE_WORKER_EXECUTOR                            worker: the executor binary (this one; tests)
 *   LATHE_WORKER_NODE_GROUP, LATHE_WORKER_RENDEZVOUS worker: its node group, and the host:port the
 *                    group's other workers reach it at for a gang across workers (both, or none)
 *   LATHE_EXECUTOR_USER, _DATA_MB, _NOFILE, _NPROC   worker: executors' uid and rlimits (lt_confine.h)
 *   LATHE_LEASE_MS, LATHE_LEASE_MARGIN_MS, LATHE_START_TIMEOUT_MS   scheduler: lease clock (tests)
 *   LATHE_PREEMPT_AFTER_S                            scheduler: a blocked production or standard job
 *                    preempts preemptible work after this wait (120; chaos runs shorten it)
 *   LATHE_KILL_DEADLINE_MS                           worker: stop asked -> SIGKILL after this (30000)
 *   LATHE_WORKER_STORE_RETRY_MS                      worker: an unreachable object store is retried
 *                    this long for an attempt's inputs and a checkpoint's upload (120000)
 *   LATHE_MAX_UNAVAILABLE_STOPS                      scheduler: attempts a job may lose to an
 *                    unreachable store (AttemptStopped unavailable) before it fails (30)
 *   LATHE_GC_GRACE_MS                                publisher: staging garbage older than this is
 *                    collected (3600000; tests and chaos runs shorten it)
 *   LATHE_API_KEY_RATE, LATHE_API_TENANT_RATE, LATHE_API_AUTH_FAIL_RATE   api: rate limits, "R/B"
 *                    (R requests a second, bursts of B) or "off"; defaults 20/40, 50/100, 2/30
 *   LATHE_API_SSE_HISTORY, LATHE_API_SSE_KEEP_ENDED_MS   api: events kept per job (1024), and how
 *                    long after a job ended (600000)
 *   LATHE_SAMPLER_THREADS, _KV_MB, _ADAPTER_MB, _MAX_RUNNING, _PREFILL_CHUNK, _QUEUE_PER_TENANT,
 *   _QUEUE_TOTAL, _CUDA=1   sampler: compute threads (1), KV cache per base model (64), adapter
 *                    cache (256), requests decoding at once (64), prompt rows per step (64),
 *                    requests in the sampler per tenant (16) and in all (128), the GPU
 *   LATHE_API_STREAM_BACKLOG   api and sampler: bytes of a stream (events, samples) its client may
 *                    leave unread before the stream is cut (4194304)
 *   LATHE_SAMPLER_PRECISION=f32|bf16   sampler: the base weights' products read the floats (f32,
 *                    the default: the answers are the training engine's, bit for bit) or bf16
 *                    copies (half the bytes a decode step streams; answers within bf16 rounding)
 *
 * Every numeric setting and switch above is read before any role starts (settings_read): one that
 * is not a whole number in its range (a number of seconds for LATHE_PREEMPT_AFTER_S; 0 or 1 for a
 * switch) stops lathed with exit 2, naming it and what it should be.
 *
 * The process-wide things are here and nowhere else: the signal events, the event base, and
 * the log format (lt_log_setup, before any thread starts; executors inherit it through
 * LATHE_LOG_FORMAT).
 * Roles are created on one event_base and run until SIGINT/SIGTERM; SIGHUP makes the api and
 * sampler ports read their TLS certificate and key files again (on_hup). */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>
#include <event2/util.h>

#include "lt_api.h"
#include "lt_engine.h"
#include "lt_publisher.h"
#include "lt_sampler.h"
#include "lt_scheduler.h"
#include "lt_tok.h"
#include "lt_worker.h"
#include "lt_bus.h"
#include "lt_conf.h"
#include "lt_config.h"
#include "lt_crypto.h"
#include "lt_embedded.h"
#include "lt_log.h"
#include "lt_metrics.h"
#include "lt_recmac.h"
#include "lt_store.h"
#include "lt_time.h"
#include "lt_utf8.h"

/* The numeric and on/off settings of every role, read from the environment (and so from --config
 * and --set) before any role starts (settings_read). Unset or empty keeps the default given here;
 * 0 is the role's own default where its conf says so, and -1 "never" where the table says so.
 * Every numeric field the table names is a long long. */
typedef struct lathed_settings {
  long long api_sse_history, api_sse_keep_ended_ms, api_threads, api_max_open_uploads, api_max_saving_calls,
      api_upload_idle_ms, api_max_downloads, api_download_window, api_max_storage_bytes, api_stream_backlog;
  long long sampler_threads, sampler_cuda, sampler_kv_mb, sampler_adapter_mb, sampler_max_running,
      sampler_prefill_chunk, sampler_queue_per_tenant, sampler_queue_total;
  long long lease_ms, lease_margin_ms, start_timeout_ms, max_unavailable_stops, scheduler_port;
  bool scheduler_port_set, preempt_after_set;
  double preempt_after_s; /* when set; negative: never preempt (lt_sched.h) */
  long long keep_checkpoints, gc_grace_ms;
  long long worker_slots, worker_threads, session_idle_ms, kill_deadline_ms, worker_store_retry_ms;
  bool access_second_staff, publisher_log_commits;
} lathed_settings_t;

#define DAY_MS (86400LL * 1000)
#define SETTING(name, unit, lo, hi, field) {name, unit, lo, hi, offsetof(lathed_settings_t, field)}

/* Every whole-number setting: its name, what it counts, and the values it may take. */
static const struct {
  const char *name, *unit;
  long long lo, hi;
  size_t off;
} numeric_settings[] = {
    SETTING("LATHE_API_SSE_HISTORY", "events", 0, 1000000, api_sse_history),
    SETTING("LATHE_API_SSE_KEEP_ENDED_MS", "milliseconds", 0, 30 * DAY_MS, api_sse_keep_ended_ms),
    SETTING("LATHE_API_THREADS", "threads (-1: the work on the loop thread)", -1, 256, api_threads),
    SETTING("LATHE_API_MAX_OPEN_UPLOADS", "uploads", 0, 1000000, api_max_open_uploads),
    SETTING("LATHE_API_MAX_SAVING_CALLS", "calls", 0, 1000000, api_max_saving_calls),
    SETTING("LATHE_API_UPLOAD_IDLE_MS", "milliseconds", 0, 30 * DAY_MS, api_upload_idle_ms),
    SETTING("LATHE_API_MAX_DOWNLOADS", "downloads", 0, 1000000, api_max_downloads),
    SETTING("LATHE_API_DOWNLOAD_WINDOW", "bytes", 0, 1LL << 32, api_download_window),
    SETTING("LATHE_API_MAX_STORAGE_BYTES", "bytes", 0, 1LL << 60, api_max_storage_bytes),
    SETTING("LATHE_API_STREAM_BACKLOG", "bytes", 0, 1LL << 40, api_stream_backlog),
    SETTING("LATHE_SAMPLER_THREADS", "threads (0: 1)", 0, 256, sampler_threads),
    SETTING("LATHE_SAMPLER_CUDA", "0 or 1", 0, 1, sampler_cuda),
    SETTING("LATHE_SAMPLER_KV_MB", "MiB", 0, 1LL << 20, sampler_kv_mb),
    SETTING("LATHE_SAMPLER_ADAPTER_MB", "MiB", 0, 1LL << 20, sampler_adapter_mb),
    SETTING("LATHE_SAMPLER_MAX_RUNNING", "requests", 0, 1000000, sampler_max_running),
    SETTING("LATHE_SAMPLER_PREFILL_CHUNK", "rows", 0, 1LL << 20, sampler_prefill_chunk),
    SETTING("LATHE_SAMPLER_QUEUE_PER_TENANT", "requests", 0, 1000000, sampler_queue_per_tenant),
    SETTING("LATHE_SAMPLER_QUEUE_TOTAL", "requests", 0, 1000000, sampler_queue_total),
    SETTING("LATHE_LEASE_MS", "milliseconds", 0, DAY_MS, lease_ms),
    SETTING("LATHE_LEASE_MARGIN_MS", "milliseconds", 0, DAY_MS, lease_margin_ms),
    SETTING("LATHE_START_TIMEOUT_MS", "milliseconds", 0, DAY_MS, start_timeout_ms),
    SETTING("LATHE_MAX_UNAVAILABLE_STOPS", "stops", 0, 1000000, max_unavailable_stops),
    SETTING("LATHE_SCHEDULER_PORT", "a port", 0, 65535, scheduler_port),
    SETTING("LATHE_KEEP_CHECKPOINTS", "checkpoints (-1: none but the newest)", -1, 1000, keep_checkpoints),
    SETTING("LATHE_GC_GRACE_MS", "milliseconds", 0, 365 * DAY_MS, gc_grace_ms),
    SETTING("LATHE_WORKER_SLOTS", "slots", 0, 1024, worker_slots),
    SETTING("LATHE_WORKER_THREADS", "threads (0: 1)", 0, 256, worker_threads),
    SETTING("LATHE_SESSION_IDLE_MS", "milliseconds (-1: never parked)", -1, 365 * DAY_MS, session_idle_ms),
    SETTING("LATHE_KILL_DEADLINE_MS", "milliseconds", 0, 3600 * 1000, kill_deadline_ms),
    SETTING("LATHE_WORKER_STORE_RETRY_MS", "milliseconds", 0, 7 * DAY_MS, worker_store_retry_ms),
};

/* Reads every setting into *s (defaults first). LT_ERR_INVALID names the first that is not what
 * it should be, with what it should be: "30s" for milliseconds, "two" for slots and "yes" for a
 * switch stop lathed before anything starts, rather than running with 30 ms, the default or
 * off. */
static lt_err_t settings_read(lathed_settings_t *s, char *err, size_t n) {
  *s = (lathed_settings_t){.sampler_threads = 1, .worker_threads = 1};
  for (size_t i = 0; i < sizeof numeric_settings / sizeof *numeric_settings; i++) {
    const char *v = getenv(numeric_settings[i].name);
    if (!v || !*v) continue;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || end == v || errno || x < numeric_settings[i].lo || x > numeric_settings[i].hi)
      return lt_errf(err, n, LT_ERR_INVALID, "%s=\"%.40s\": expected %s, a whole number from %lld to %lld",
                     numeric_settings[i].name, v, numeric_settings[i].unit, numeric_settings[i].lo,
                     numeric_settings[i].hi);
    *(long long *)((char *)s + numeric_settings[i].off) = x;
    if (strcmp(numeric_settings[i].name, "LATHE_SCHEDULER_PORT") == 0) s->scheduler_port_set = true;
  }
  const char *v = getenv("LATHE_PREEMPT_AFTER_S");
  if (v && *v) {
    char *end;
    double x = strtod(v, &end);
    if (*end || end == v || !isfinite(x) || x < -1 || x > 1e9)
      return lt_errf(err, n, LT_ERR_INVALID,
                     "LATHE_PREEMPT_AFTER_S=\"%.40s\": expected seconds, a number from 0 to 1e9 (-1: never preempt)", v);
    s->preempt_after_s = x;
    s->preempt_after_set = true;
  }
  const struct {
    const char *name;
    bool *out;
  } switches[] = {{"LATHE_ACCESS_SECOND_STAFF", &s->access_second_staff},
                  {"LATHE_PUBLISHER_LOG_COMMITS", &s->publisher_log_commits}};
  for (size_t i = 0; i < sizeof switches / sizeof *switches; i++) {
    v = getenv(switches[i].name);
    if (!v || !*v) continue;
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
      return lt_errf(err, n, LT_ERR_INVALID, "%s=\"%.40s\": expected 1 (on) or 0 (off)", switches[i].name, v);
    *switches[i].out = v[0] == '1';
  }
  return LT_OK;
}

typedef struct lathed {
  struct event_base *base;
  lt_bus_conf_t *bus;       /* the environment's; each role adds its principal to a copy */
  lt_bus_conf_t *role_bus[5]; /* those copies: api, scheduler, publisher, worker, sampler */
  lt_store_t *store;
  lt_crypto_kek_t *kek;
  lt_recmac_key_t *tenant_mac; /* from kek: every role folds only signed tenant records */
  lt_avro_registry_t *reg;
  lt_api_t *api;
  lt_api_t *sampler_api;   /* the sampler role's HTTP side */
  lt_sampler_t *sampler;   /* and its backend */
  lt_sample_ops_t sampler_ops;
  lt_scheduler_t *scheduler;
  lt_publisher_t *publisher;
  lt_worker_t *worker;
  lt_metrics_server_t *worker_ops, *publisher_ops; /* their operator endpoints */
  lt_embedded_t *embedded; /* --embedded: the mock cluster the roles use */
  lt_tok_t *tok;           /* api: the bundled model's tokenizer for dataset reports, or NULL */
  struct {                 /* api: base models' tokenizers for /v1/tokenize, loaded when first asked */
    char model[64];
    lt_tok_t *tok;
  } toks[8];
  struct {                 /* api: base models' configs, for the bytes of a session's checkpoint */
    char model[LT_JOB_NAME_MAX];
    lt_model_config_t mc;
    bool ok;               /* false: none there when last looked (at_ms), looked at again a minute on */
    int64_t at_ms;
  } cfgs[8];
  char instance[128];
  char models[2048];       /* LATHE_MODELS_DIR, else the build's default */
  lathed_settings_t set;   /* every role's numbers and switches (settings_read) */
  struct event *drain_ev;  /* SIGTERM with a worker: its drain's watch (on_drain_tick) */
  int64_t drain_until_ms;  /* when the watch gives up: the kill deadline and DRAIN_MARGIN_MS */
} lathed_t;

/* What a drain allows past the worker's kill deadline: the killed attempts' records. */
#define DRAIN_MARGIN_MS 15000

static void usage(FILE *f) {
  fprintf(f,
          "usage: lathed --role api|scheduler|worker|publisher|sampler|all [--bind ADDR] [--port N]\n"
          "              [--operator-bind ADDR] [--operator-port N] [--max-connections N]\n"
          "              [--tls-cert PEM --tls-key PEM] [--sampler-port N (with --role all)]\n"
          "              [--scheduler-port N (with --role scheduler or all)] [--log-format text|json]\n"
          "              [--config FILE] [--set NAME=VALUE]...\n"
          "       lathed --role all --embedded [--port N] [--data DIR]\n"
          "\n--embedded runs every role in one process with no server to start: Kafka is librdkafka's\n"
          "mock cluster IN MEMORY (every tenant, job and record is gone when lathed stops), the store\n"
          "is DIR/store (DIR: ./var/embedded), the master key DIR/master.key unless one is set.\n"
          "It prints, and writes to DIR/env, the exports that let `lathe` reach it from another\n"
          "shell (`. DIR/env; lathe admin tenant create ID`).\n"
          "\nThe api serves customers on --bind:--port (127.0.0.1:8080) and /healthz and /metrics only on\n"
          "--operator-bind:--operator-port (127.0.0.1:8081); 0 is any free port. With --tls-cert and\n"
          "--tls-key (PEM files) the customer port speaks HTTPS. Rate limits:\n"
          "LATHE_API_KEY_RATE (20/40), LATHE_API_TENANT_RATE (50/100), LATHE_API_AUTH_FAIL_RATE (2/30,\n"
          "per source address), each \"R/B\" (R a second, bursts of B) or \"off\".\n"
          "\nThe scheduler serves /healthz, /metrics and /v1/admin/queue (`lathe admin queue`) on\n"
          "--operator-bind:--scheduler-port (or LATHE_SCHEDULER_PORT; off unless one is given; 0 is any\n"
          "free port): plain HTTP without authentication, for loopback.\n"
          "\nA worker and a publisher serve /healthz and /metrics on --operator-bind:--operator-port\n"
          "(any free port unless given; with --role all, always any free port). Each prints the port.\n"
          "\n--log-format json (or LATHE_LOG_FORMAT=json) writes every log line as one JSON object: ts,\n"
          "level, role, instance, msg, and job, tenant, attempt, session when the line is about one.\n"
          "\nLATHE_MODELS_DIR, LATHE_WORKER_SLOTS and LATHE_WORKER_THREADS configure a worker.\n"
          "\n"
          "--config FILE reads NAME=VALUE lines (a LATHE_ setting, or kafka.PROPERTY for any librdkafka\n"
          "property); --set NAME=VALUE sets one. A flag wins over the environment, which wins over a file.\n"
          "Configuration from the environment: LATHE_KAFKA_BOOTSTRAP, LATHE_TOPIC_PREFIX,\n"
          "LATHE_KAFKA_CONFIG (a file of librdkafka name=value properties: SASL, TLS) and\n"
          "LATHE_KAFKA_CONFIG_DIR (ROLE.properties per role: each role its own principal),\n"
          "LATHE_S3_ENDPOINT/_BUCKET/_ACCESS_KEY/_SECRET_KEY (or LATHE_STORE_DIR for a local\n"
          "directory store), LATHE_MASTER_KEY_FILE or LATHE_MASTER_KEY, LATHE_INSTANCE.\n"
          "`eval \"$(ops/stack env)\"` sets them for the local stack.\n"
          "\nEvery LATHE_ setting a part of Lathe reads (another LATHE_ name in --config or --set stops\n"
          "lathed, naming the nearest of these):\n");
  int col = 0;
  for (size_t i = 0; lt_conf_name(i); i++) {
    const char *name = lt_conf_name(i);
    if (col && col + 1 + (int)strlen(name) > 100) fputc('\n', f), col = 0;
    col += fprintf(f, "%s%s", col ? " " : "  ", name);
  }
  fputc('\n', f);
}

/* Token counts of uploaded examples for the API's pre-flight report, with the bundled base
 * model's tokenizer (or LATHE_TOKENIZER): the same encoding training will use. */
static int64_t count_tokens(void *ctx, lt_dataset_format_t format, const json_t *line) {
  (void)format;
  char *text = json_dumps(line, JSON_COMPACT);
  if (!text) return -1;
  lt_tok_seq_t seq;
  lt_tok_seq_init(&seq);
  lt_err_t err = lt_tok_encode_json_line(ctx, text, strlen(text), &seq, NULL, 0);
  int64_t n = err ? -1 : (int64_t)seq.len;
  lt_tok_seq_free(&seq);
  free(text);
  return n;
}

/* The tokenizer of base model `model` (an id: no '/'), from <models>/<model>/tokenizer.json, kept
 * once loaded; NULL (reported) when there is none. */
static lt_tok_t *model_tokenizer(lathed_t *d, const char *model, char *err, size_t n) {
  int free_slot = -1;
  for (int i = 0; i < 8; i++) {
    if (d->toks[i].tok && strcmp(d->toks[i].model, model) == 0) return d->toks[i].tok;
    if (!d->toks[i].tok && free_slot < 0) free_slot = i;
  }
  char path[2200];
  snprintf(path, sizeof path, "%s/%s/tokenizer.json", d->models, model);
  lt_tok_t *tok = NULL;
  if (access(path, R_OK) != 0 || lt_tok_load_file(path, &tok, err, n)) {
    snprintf(err, n, LT_API_NO_TOKENIZER, model);
    return NULL;
  }
  if (free_slot < 0) {
    lt_tok_destroy(d->toks[7].tok);
    free_slot = 7;
  }
  snprintf(d->toks[free_slot].model, sizeof d->toks[free_slot].model, "%s", model);
  d->toks[free_slot].tok = tok;
  return tok;
}

/* /v1/tokenize ({"tokens"} of a string) and /v1/detokenize ({"text"} of ids) for the API. */
static lt_err_t tokenize(void *ctx, const char *model, const json_t *in, json_t **out, char *err, size_t n) {
  lt_tok_t *tok = model_tokenizer(ctx, model, err, n);
  if (!tok) return LT_ERR_NOT_FOUND;
  if (json_is_string(in)) {
    lt_tok_seq_t seq;
    lt_tok_seq_init(&seq);
    lt_err_t e = lt_tok_encode(tok, json_string_value(in), json_string_length(in), 0, 1, &seq, err, n);
    json_t *ids = e ? NULL : json_array();
    for (size_t i = 0; ids && i < seq.len; i++) json_array_append_new(ids, json_integer(seq.ids[i]));
    lt_tok_seq_free(&seq);
    if (!e && !(*out = json_pack("{s:o}", "tokens", ids))) e = LT_ERR_NOMEM; /* nothing out on an error */
    return e;
  }
  size_t count = json_array_size(in);
  int32_t *ids = malloc((count ? count : 1) * sizeof *ids);
  if (!ids) return LT_ERR_NOMEM;
  for (size_t i = 0; i < count; i++) {
    const json_t *v = json_array_get(in, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= lt_tok_vocab_size(tok)) {
      free(ids);
      return lt_errf(err, n, LT_ERR_INVALID, "tokens[%zu] is not a token id of %s (0 to %d)", i, model,
                     lt_tok_vocab_size(tok) - 1);
    }
    ids[i] = (int32_t)json_integer_value(v);
  }
  char *text = NULL;
  size_t len = 0;
  lt_err_t e = lt_tok_decode(tok, ids, count, 0, &text, &len, err, n);
  free(ids);
  char *valid = e ? NULL : lt_utf8_sanitize(text, len, &len);
  if (!e && !(*out = valid ? json_pack("{s:s%}", "text", valid, len) : NULL)) e = LT_ERR_NOMEM;
  free(valid);
  free(text);
  return e;
}

static int vocab_size(void *ctx, const char *model) {
  char err[256];
  lt_tok_t *tok = model_tokenizer(ctx, model, err, sizeof err);
  return tok ? lt_tok_vocab_size(tok) : 0;
}

/* The bytes one checkpoint of a LoRA session on base model `model` takes at least
 * (lt_lora_checkpoint_bytes), from <models>/<model>/config.json, kept once read (a model with
 * none is looked for again a minute on, not at every call); 0 when no such model is here. */
static uint64_t checkpoint_bytes(void *ctx, const char *model, int rank, unsigned targets) {
  lathed_t *d = ctx;
  int slot = -1, free_slot = -1;
  for (int i = 0; i < 8 && slot < 0; i++) {
    if (d->cfgs[i].model[0] && strcmp(d->cfgs[i].model, model) == 0) slot = i;
    else if (!d->cfgs[i].model[0] && free_slot < 0) free_slot = i;
  }
  int64_t now = lt_time_mono_ms();
  if (slot < 0 || (!d->cfgs[slot].ok && now - d->cfgs[slot].at_ms > 60000)) {
    char dir[2200], err[256];
    if (slot < 0) slot = free_slot < 0 ? 7 : free_slot;
    snprintf(d->cfgs[slot].model, sizeof d->cfgs[slot].model, "%s", model);
    snprintf(dir, sizeof dir, "%s/%s", d->models, model);
    d->cfgs[slot].ok = lt_model_config_load(dir, &d->cfgs[slot].mc, err, sizeof err) == LT_OK;
    d->cfgs[slot].at_ms = now;
  }
  return d->cfgs[slot].ok ? lt_lora_checkpoint_bytes(&d->cfgs[slot].mc, rank, targets) : 0;
}

static lt_tok_t *load_tokenizer(const char *models) {
  char path[2200];
  const char *p = getenv("LATHE_TOKENIZER");
  if (!p) {
    snprintf(path, sizeof path, "%s/lathe-tiny/tokenizer.json", models);
    p = path;
  }
  lt_tok_t *tok = NULL;
  char err[256];
  if (access(p, R_OK) != 0) return NULL;
  if (lt_tok_load_file(p, &tok, err, sizeof err)) {
    lt_log_warn("api", "no token counts in dataset reports: %s", err);
    return NULL;
  }
  return tok;
}

/* Stops the loop once the draining worker holds no attempt, or at the drain's bound. */
static void on_drain_tick(evutil_socket_t fd, short what, void *arg) {
  lathed_t *d = arg;
  bool idle = lt_worker_idle(d->worker);
  if (!idle && lt_time_mono_ms() < d->drain_until_ms) return;
  if (idle) lt_log_info(NULL, "worker drained, stopping");
  else lt_log_warn(NULL, "worker still busy at the drain's bound, stopping");
  event_base_loopexit(d->base, NULL);
}

/* Drains the worker and watches the drain: the loop stops once no attempt holds a slot, or at the
 * bound. False when the watch cannot be set up. */
static bool drain_then_stop(lathed_t *d) {
  int64_t bound = lt_worker_drain(d->worker) + DRAIN_MARGIN_MS;
  d->drain_until_ms = lt_time_mono_ms() + bound;
  lt_log_info(NULL, "the drain ends when no attempt holds a slot, at most in %lld ms", (long long)bound);
  d->drain_ev = event_new(d->base, -1, EV_PERSIST, on_drain_tick, d);
  struct timeval tick = {0, 100000};
  return d->drain_ev && event_add(d->drain_ev, &tick) == 0;
}

/* SIGTERM (systemd's stop) drains a worker first: its attempts checkpoint and stop, each job
 * queued again and charged nothing, before the process goes (lt_worker_drain). SIGINT, a second
 * SIGTERM, a process with no worker, or --embedded (its log dies with it): stop now (a running
 * attempt is then lost: its lease expires and the job is queued again, the attempt counted as
 * failed). */
static void on_signal(evutil_socket_t sig, short what, void *arg) {
  lathed_t *d = arg;
  if (sig == SIGTERM && d->worker && !d->embedded && !d->drain_ev) {
    lt_log_info(NULL, "SIGTERM, draining the worker (SIGINT or SIGTERM again: stop now)");
    if (drain_then_stop(d)) return;
  }
  lt_log_info(NULL, "%s, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
  event_base_loopexit(d->base, NULL);
}

/* SIGHUP: the customer ports read their TLS certificate and key again (a renewed certificate, no
 * restart); a port whose new files cannot be used keeps the one it served. Nothing else reloads. */
static void on_hup(evutil_socket_t sig, short what, void *arg) {
  lathed_t *d = arg;
  (void)sig, (void)what;
  lt_api_t *apis[] = {d->api, d->sampler_api};
  const char *names[] = {"api", "sampler"};
  bool any = false;
  for (int i = 0; i < 2; i++) {
    char err[600];
    lt_err_t e = apis[i] ? lt_api_tls_reload(apis[i], err, sizeof err) : LT_ERR_NOT_FOUND;
    if (e == LT_ERR_NOT_FOUND) continue; /* no such role here, or plain HTTP */
    any = true;
    if (e) lt_log_error(NULL, "SIGHUP: %s: %s; the certificate served before stays", names[i], err);
    else lt_log_info(NULL, "SIGHUP: %s: the TLS certificate was read again", names[i]);
  }
  if (!any) lt_log_info(NULL, "SIGHUP: nothing to reload (no TLS customer port in this process)");
}

/* An operator drained the worker (lathe admin drain, lt_worker_conf_t.on_drain). A process that is
 * only a worker then stops as after SIGTERM (exit 0: systemd's Restart=on-failure leaves it
 * stopped); one with other roles keeps them, its worker taking no work until it restarts. */
static void on_operator_drain(void *ctx, const char *reason) {
  lathed_t *d = ctx;
  (void)reason;
  if (d->drain_ev) return;
  if (d->api || d->scheduler || d->publisher || d->sampler || d->embedded) {
    lt_log_info(NULL, "the worker drains; this process's other roles go on, and its worker takes no work until it "
                      "restarts");
    return;
  }
  if (!drain_then_stop(d)) event_base_loopexit(d->base, NULL);
}

/* This process's name in records and log lines: LATHE_INSTANCE, else the host name. */
static void instance_name(char *out, size_t n) {
  const char *inst = getenv("LATHE_INSTANCE");
  if (inst && *inst) snprintf(out, n, "%s", inst);
  else if (gethostname(out, n) != 0) snprintf(out, n, "lathed");
}

static int setup_common(lathed_t *d, char *err, size_t n) {
  d->bus = lt_bus_conf_new();
  if (!d->bus) return lt_errf(err, n, LT_ERR_NOMEM, "out of memory");
  lt_err_t e = lt_bus_conf_from_env(d->bus, err, n);
  if (!e) e = lt_avro_registry_new(&d->reg, err, n);
  if (!e) e = lt_crypto_kek_from_env(&d->kek, err, n);
  if (!e) e = lt_recmac_key_new(d->kek, LT_RECMAC_TENANTS, &d->tenant_mac, err, n);
  if (e) return e;
  const char *dir = getenv("LATHE_STORE_DIR");
  if (dir && *dir) return lt_store_dir_new(&d->store, dir, err, n);
  lt_store_s3_conf_t s3;
  if ((e = lt_store_s3_conf_from_env(&s3, err, n))) return e;
  return lt_store_s3_new(&d->store, &s3, err, n);
}

/* What the command line asked for. */
typedef struct lathed_opts {
  const char *role, *bind, *data_dir, *ops_bind, *tls_cert, *tls_key, *log_format;
  bool embedded, api, scheduler, publisher, worker, sampler, sampler_port_set, sched_port_set, ops_port_set;
  uint16_t port, ops_port, sampler_port, sched_port;
  int max_connections;
} lathed_opts_t;

/* A number argument of an option into *out; false after saying what is wrong. */
static bool num_arg(const char *opt, const char *text, long lo, long hi, long *out) {
  char *end;
  long v = strtol(text, &end, 10);
  if (*end || end == text || v < lo || v > hi) {
    lt_log_error(NULL, "%s must be %ld..%ld, not \"%s\"", opt, lo, hi, text);
    return false;
  }
  *out = v;
  return true;
}

/* Parses argv into *o. Returns -1 to go on, else the exit status (--help, --version: 0; a bad
 * argument: 2, after saying which). */
static int parse_args(int argc, char **argv, lathed_opts_t *o) {
  *o = (lathed_opts_t){.bind = "127.0.0.1", .port = 8080, .ops_bind = "127.0.0.1", .ops_port = 8081};
  long v;
  for (int i = 1; i < argc; i++) {
    bool more = i + 1 < argc;
    if (strcmp(argv[i], "--role") == 0 && more) o->role = argv[++i];
    else if (strcmp(argv[i], "--bind") == 0 && more) o->bind = argv[++i];
    else if (strcmp(argv[i], "--operator-bind") == 0 && more) o->ops_bind = argv[++i];
    else if (strcmp(argv[i], "--tls-cert") == 0 && more) o->tls_cert = argv[++i];
    else if (strcmp(argv[i], "--tls-key") == 0 && more) o->tls_key = argv[++i];
    else if (strcmp(argv[i], "--embedded") == 0) o->embedded = true;
    else if (strcmp(argv[i], "--data") == 0 && more) o->data_dir = argv[++i];
    else if (strcmp(argv[i], "--log-format") == 0 && more) o->log_format = argv[++i];
    else if (strcmp(argv[i], "--port") == 0 && more) {
      if (!num_arg("--port", argv[++i], 0, 65535, &v)) return 2;
      o->port = (uint16_t)v;
    } else if (strcmp(argv[i], "--operator-port") == 0 && more) {
      if (!num_arg("--operator-port", argv[++i], 0, 65535, &v)) return 2;
      o->ops_port = (uint16_t)v;
      o->ops_port_set = true;
    } else if (strcmp(argv[i], "--scheduler-port") == 0 && more) {
      if (!num_arg("--scheduler-port", argv[++i], 0, 65535, &v)) return 2;
      o->sched_port = (uint16_t)v;
      o->sched_port_set = true;
    } else if (strcmp(argv[i], "--sampler-port") == 0 && more) {
      if (!num_arg("--sampler-port", argv[++i], 0, 65535, &v)) return 2;
      o->sampler_port = (uint16_t)v;
      o->sampler_port_set = true;
    } else if (strcmp(argv[i], "--max-connections") == 0 && more) {
      if (!num_arg("--max-connections", argv[++i], 1, 1000000, &v)) return 2;
      o->max_connections = (int)v;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("lathed %s\n", LT_VERSION);
      return 0;
    } else {
      fprintf(stderr, "lathed: unknown argument \"%s\"\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  lt_log_format_t fmt;
  if (o->log_format && !lt_log_format_parse(o->log_format, &fmt)) {
    fprintf(stderr, "lathed: --log-format must be text or json, not \"%s\"\n", o->log_format);
    return 2;
  }
  if (o->role && strcmp(o->role, "executor") == 0) return -1;
  bool all = o->role && strcmp(o->role, "all") == 0;
  o->api = all || (o->role && strcmp(o->role, "api") == 0);
  o->scheduler = all || (o->role && strcmp(o->role, "scheduler") == 0);
  o->publisher = all || (o->role && strcmp(o->role, "publisher") == 0);
  o->worker = all || (o->role && strcmp(o->role, "worker") == 0);
  o->sampler = (all && o->sampler_port_set) || (o->role && strcmp(o->role, "sampler") == 0);
  if (o->sampler && !all) o->sampler_port = o->port;
  if (!o->api && !o->scheduler && !o->publisher && !o->worker && !o->sampler) {
    fprintf(stderr, "lathed: --role must be api, scheduler, worker, publisher, sampler or all (not \"%s\")\n",
            o->role ? o->role : "(missing)");
    usage(stderr);
    return 2;
  }
  if ((o->embedded || o->data_dir) && (!all || !o->embedded)) {
    fprintf(stderr, "lathed: --embedded goes with --role all (and --data with --embedded)\n");
    return 2;
  }
  return -1;
}

/* --embedded: the mock cluster, directory store and key, before setup_common reads what it
 * exports. */
static lt_err_t start_embedded(lathed_t *d, const lathed_opts_t *o, char *err, size_t n) {
  lt_embedded_conf_t ec = {.data_dir = o->data_dir};
  lt_err_t e = lt_embedded_start(&ec, &d->embedded, err, n);
  if (e) return e;
  lt_log_info(NULL, "embedded: in-memory Kafka (mock cluster) at %s, store and key in %s",
          lt_embedded_bootstrap(d->embedded), lt_embedded_dir(d->embedded));
  return LT_OK;
}

/* A rate limit from the environment (name unset: the API's default). */
static lt_err_t rate_from_env(const char *name, lt_api_rate_t *out, char *err, size_t n) {
  const char *v = getenv(name);
  if (!v || !*v || lt_api_rate_parse(v, out)) return LT_OK;
  return lt_errf(err, n, LT_ERR_INVALID, "%s=\"%s\" is not a rate: use R/B (R a second, bursts of B) or off", name, v);
}

/* A copy of the environment's bus configuration with role's principal
 * (lt_bus_conf_for_role), owned by d. With --role all each role still gets its own. */
static lt_err_t role_bus(lathed_t *d, int slot, const char *role, lt_bus_conf_t **out, char *err, size_t n) {
  d->role_bus[slot] = lt_bus_conf_dup(d->bus);
  if (!d->role_bus[slot]) return lt_errf(err, n, LT_ERR_NOMEM, "out of memory");
  *out = d->role_bus[slot];
  return lt_bus_conf_for_role(d->role_bus[slot], role, err, n);
}

static lt_err_t start_api(lathed_t *d, const lathed_opts_t *o, char *err, size_t n) {
  char producer[160];
  lt_bus_conf_t *bus;
  lt_err_t e = role_bus(d, 0, "api", &bus, err, n);
  if (e) return e;
  d->tok = load_tokenizer(d->models);
  snprintf(producer, sizeof producer, "api/%s", d->instance);
  lt_api_conf_t conf = {.bind_addr = o->bind, .port = o->port, .bus = bus, .store = d->store,
                        .kek = d->kek, .tenant_mac = d->tenant_mac, .registry = d->reg, .producer_id = producer,
                        .tokens_fn = d->tok ? count_tokens : NULL, .tokens_ctx = d->tok,
                        .tokenize_fn = tokenize, .vocab_fn = vocab_size, .checkpoint_bytes_fn = checkpoint_bytes,
                        .tokenize_ctx = d, .operator_bind_addr = o->ops_bind, .operator_port = o->ops_port,
                        .max_connections = o->max_connections, .tls_cert_file = o->tls_cert,
                        .tls_key_file = o->tls_key, .staff_keys_file = getenv("LATHE_STAFF_KEYS_FILE")};
  conf.access_second_staff = d->set.access_second_staff;
  e = rate_from_env("LATHE_API_KEY_RATE", &conf.key_rate, err, n);
  if (!e) e = rate_from_env("LATHE_API_TENANT_RATE", &conf.tenant_rate, err, n);
  if (!e) e = rate_from_env("LATHE_API_AUTH_FAIL_RATE", &conf.auth_fail_rate, err, n);
  const lathed_settings_t *set = &d->set; /* 0 or unset keeps the defaults (lt_api.h) */
  conf.sse_history = (int)set->api_sse_history;
  conf.sse_keep_ended_ms = set->api_sse_keep_ended_ms;
  conf.work_threads = (int)set->api_threads;
  conf.max_open_uploads = (int)set->api_max_open_uploads;
  conf.max_saving_calls = (int)set->api_max_saving_calls;
  conf.upload_idle_ms = set->api_upload_idle_ms;
  conf.max_downloads = (int)set->api_max_downloads;
  conf.download_window = (size_t)set->api_download_window;
  conf.max_storage_bytes = (uint64_t)set->api_max_storage_bytes;
  conf.stream_backlog = (size_t)set->api_stream_backlog; /* its jobs' event streams */
  if (!e) e = lt_api_new(d->base, &conf, &d->api, err, n);
  if (e) return e;
  /* Tests and scripts read the two ports from these lines. */
  lt_log_info(NULL, "api operator endpoints (/healthz, /metrics) at http://%s:%u", o->ops_bind,
              lt_api_operator_port(d->api));
  lt_log_info(NULL, "api listening on %s://%s:%u", o->tls_cert ? "https" : "http", o->bind, lt_api_port(d->api));
  return LT_OK;
}

/* The sampler: its backend over the base models, then an API instance serving only the sampling
 * routes over it, under the sampler's own Kafka principal. */
static lt_err_t start_sampler(lathed_t *d, const lathed_opts_t *o, char *err, size_t n) {
  const char *prec = getenv("LATHE_SAMPLER_PRECISION");
  if (prec && *prec && strcmp(prec, "f32") != 0 && strcmp(prec, "bf16") != 0)
    return lt_errf(err, n, LT_ERR_INVALID, "LATHE_SAMPLER_PRECISION=\"%s\": expected f32 or bf16", prec);
  const lathed_settings_t *set = &d->set;
  lt_sampler_conf_t sc = {.models_dir = d->models, .threads = (int)set->sampler_threads,
                          .cuda = (int)set->sampler_cuda,
                          .bf16_weights = prec && strcmp(prec, "bf16") == 0,
                          .kv_bytes = (size_t)set->sampler_kv_mb << 20,
                          .adapter_bytes = (size_t)set->sampler_adapter_mb << 20,
                          .max_running = (int)set->sampler_max_running,
                          .prefill_chunk = (int)set->sampler_prefill_chunk,
                          .queue_per_tenant = (int)set->sampler_queue_per_tenant,
                          .queue_total = (int)set->sampler_queue_total};
  lt_err_t e = lt_sampler_new(&sc, &d->sampler, err, n);
  if (e) return e;
  lt_sampler_ops(d->sampler, &d->sampler_ops);
  lt_bus_conf_t *bus;
  if ((e = role_bus(d, 4, "sampler", &bus, err, n))) return e;
  char producer[160];
  snprintf(producer, sizeof producer, "sampler/%s", d->instance);
  bool alone = !o->api;
  lt_api_conf_t conf = {.bind_addr = o->bind, .port = o->sampler_port, .bus = bus, .store = d->store,
                        .kek = d->kek, .tenant_mac = d->tenant_mac, .registry = d->reg, .producer_id = producer,
                        .tokenize_fn = tokenize, .vocab_fn = vocab_size, .tokenize_ctx = d,
                        .operator_bind_addr = o->ops_bind, .operator_port = alone ? o->ops_port : 0,
                        .max_connections = o->max_connections, .tls_cert_file = o->tls_cert,
                        .tls_key_file = o->tls_key, .sampler = &d->sampler_ops, .sampler_only = true};
  e = rate_from_env("LATHE_API_KEY_RATE", &conf.key_rate, err, n);
  if (!e) e = rate_from_env("LATHE_API_TENANT_RATE", &conf.tenant_rate, err, n);
  conf.stream_backlog = (size_t)set->api_stream_backlog; /* 0: the default (lt_api.h) */
  if (!e) e = lt_api_new(d->base, &conf, &d->sampler_api, err, n);
  if (e) return e;
  lt_log_info(NULL, "sampler operator endpoints (/healthz, /metrics) at http://%s:%u", o->ops_bind,
              lt_api_operator_port(d->sampler_api));
  lt_log_info(NULL, "sampler listening on %s://%s:%u", o->tls_cert ? "https" : "http", o->bind,
              lt_api_port(d->sampler_api));
  return LT_OK;
}

static lt_err_t start_scheduler(lathed_t *d, const lathed_opts_t *o, char *err, size_t n) {
  char producer[160];
  snprintf(producer, sizeof producer, "scheduler/%s", d->instance);
  lt_bus_conf_t *bus;
  lt_err_t e = role_bus(d, 1, "scheduler", &bus, err, n);
  if (e) return e;
  lt_scheduler_conf_t sc = {.bus = bus, .registry = d->reg, .tenant_mac = d->tenant_mac, .producer_id = producer,
                            .store = d->store};
  /* Tests and small deployments shorten the lease clock; 0 or unset keeps the defaults. */
  const lathed_settings_t *set = &d->set;
  sc.lease_ms = set->lease_ms;
  sc.lease_margin_ms = set->lease_margin_ms;
  sc.start_timeout_ms = set->start_timeout_ms;
  sc.max_unavailable_stops = (int)set->max_unavailable_stops;
  lt_sched_config_t policy; /* copied by lt_scheduler_new */
  if (set->preempt_after_set) {
    lt_sched_config_default(&policy);
    policy.preempt_after_s = set->preempt_after_s;
    sc.policy = &policy;
  }
  /* The operator endpoint only when asked for: several schedulers may share a host. */
  if (o->sched_port_set || set->scheduler_port_set) {
    sc.operator_bind_addr = o->ops_bind;
    sc.operator_port = (uint16_t)(o->sched_port_set ? o->sched_port : set->scheduler_port);
  }
  e = lt_scheduler_new(d->base, &sc, &d->scheduler, err, n);
  if (!e) lt_log_info(NULL, "scheduler started");
  if (!e && sc.operator_bind_addr)
    lt_log_info(NULL, "scheduler operator endpoints (/healthz, /metrics, /v1/admin/queue) at http://%s:%u",
                o->ops_bind, lt_scheduler_operator_port(d->scheduler));
  return e;
}

/* The operator port of a role without a server of its own (worker, publisher): --operator-port
 * when given to that role alone, else any free port, so that several roles and instances share
 * a host without a clash; the port is printed either way. */
static lt_err_t start_ops(lathed_t *d, const lathed_opts_t *o, const char *role, lt_metrics_render_fn render,
                          lt_metrics_health_fn health, void *ctx, lt_metrics_server_t **out, char *err, size_t n) {
  bool alone = !o->api && !o->sampler && !(o->worker && o->publisher);
  uint16_t port = alone && o->ops_port_set ? o->ops_port : 0;
  lt_err_t e = lt_metrics_server_new(d->base, o->ops_bind, port, render, health, ctx, out, err, n);
  if (!e)
    lt_log_info(NULL, "%s operator endpoints (/healthz, /metrics) at http://%s:%u", role, o->ops_bind,
                lt_metrics_server_port(*out));
  return e;
}

static char *publisher_metrics(void *ctx) { return lt_publisher_metrics(ctx); }
static int publisher_health(void *ctx, char **json) { return lt_publisher_health(ctx, json); }
static char *worker_metrics(void *ctx) { return lt_worker_metrics(ctx); }
static int worker_health(void *ctx, char **json) { return lt_worker_health(ctx, json); }

static lt_err_t start_publisher(lathed_t *d, const lathed_opts_t *o, char *err, size_t n) {
  char producer[160];
  snprintf(producer, sizeof producer, "publisher/%s", d->instance);
  lt_bus_conf_t *bus;
  lt_err_t e = role_bus(d, 2, "publisher", &bus, err, n);
  if (e) return e;
  lt_publisher_conf_t pc = {.bus = bus, .store = d->store, .kek = d->kek, .tenant_mac = d->tenant_mac,
                            .registry = d->reg,
                            .producer_id = producer, .keep_checkpoints = (int)d->set.keep_checkpoints,
                            .gc_grace_ms = d->set.gc_grace_ms, .log_commits = d->set.publisher_log_commits};
  e = lt_publisher_new(d->base, &pc, &d->publisher, err, n);
  if (!e) lt_log_info(NULL, "publisher started");
  if (!e)
    e = start_ops(d, o, "publisher", publisher_metrics, publisher_health, d->publisher, &d->publisher_ops, err, n);
  return e;
}

static lt_err_t start_worker(lathed_t *d, const lathed_opts_t *o, char *err, size_t n) {
  const lathed_settings_t *set = &d->set;
  lt_bus_conf_t *bus;
  lt_err_t e = role_bus(d, 3, "worker", &bus, err, n);
  if (e) return e;
  lt_worker_conf_t wc = {.bus = bus, .store = d->store, .kek = d->kek, .tenant_mac = d->tenant_mac,
                         .registry = d->reg,
                         .worker_id = d->instance, .models_dir = d->models,
                         .mem_root = getenv("LATHE_WORKER_MEM_DIR"),
                         .executor_path = getenv("LATHE_WORKER_EXECUTOR"),
                         .slots = (int)set->worker_slots, .threads_per_executor = (int)set->worker_threads,
                         .backend = getenv("LATHE_WORKER_BACKEND"),
                         .session_idle_ms = set->session_idle_ms, .kill_deadline_ms = (int)set->kill_deadline_ms,
                         .store_retry_ms = set->worker_store_retry_ms,
                         .node_group = getenv("LATHE_WORKER_NODE_GROUP"), .rendezvous = getenv("LATHE_WORKER_RENDEZVOUS"),
                         .on_drain = on_operator_drain, .on_drain_ctx = d};
  e = lt_worker_new(d->base, &wc, &d->worker, err, n);
  if (!e) lt_log_info(NULL, "worker %s started (models in %s)", d->instance, d->models);
  if (!e) e = start_ops(d, o, "worker", worker_metrics, worker_health, d->worker, &d->worker_ops, err, n);
  return e;
}

/* --embedded: prints (and writes to DIR/env) the exports another shell needs to reach us. */
static lt_err_t announce_embedded(lathed_t *d, const lathed_opts_t *o, char *err, size_t n) {
  char url[300];
  bool any = strcmp(o->bind, "0.0.0.0") == 0 || strcmp(o->bind, "::") == 0;
  snprintf(url, sizeof url, "%s://%s:%u", o->tls_cert ? "https" : "http", any ? "127.0.0.1" : o->bind,
           lt_api_port(d->api));
  lt_err_t e = lt_embedded_write_env(d->embedded, url, stdout, err, n);
  if (!e)
    lt_log_info(NULL, "embedded: ready; the exports above are in %s/env (in memory: gone on exit)",
                lt_embedded_dir(d->embedded));
  return e;
}

/* Starts the roles asked for, in order; on failure err says which role and why. */
static lt_err_t start_roles(lathed_t *d, const lathed_opts_t *o, char *err, size_t n) {
  char why[512] = "";
  lt_err_t e = LT_OK;
  const char *what = "embedded";
  if (o->embedded && (e = start_embedded(d, o, why, sizeof why))) goto fail;
  what = NULL;
  if ((e = setup_common(d, why, sizeof why))) goto fail;
  const char *md = getenv("LATHE_MODELS_DIR");
  snprintf(d->models, sizeof d->models, "%s", md && *md ? md : LT_MODELS_DIR);
  if (o->api && (what = "api") && (e = start_api(d, o, why, sizeof why))) goto fail;
  if (o->scheduler && (what = "scheduler") && (e = start_scheduler(d, o, why, sizeof why))) goto fail;
  if (o->publisher && (what = "publisher") && (e = start_publisher(d, o, why, sizeof why))) goto fail;
  if (o->worker && (what = "worker") && (e = start_worker(d, o, why, sizeof why))) goto fail;
  if (o->sampler && (what = "sampler") && (e = start_sampler(d, o, why, sizeof why))) goto fail;
  if (d->embedded && (what = "embedded") && (e = announce_embedded(d, o, why, sizeof why))) goto fail;
  return LT_OK;
fail:
  if (what) snprintf(err, n, "%s: %s", what, why);
  else snprintf(err, n, "%s", why);
  return e;
}

/* Runs the event loop until SIGINT or SIGTERM. */
static void run_until_signal(lathed_t *d) {
  struct event *sigint = evsignal_new(d->base, SIGINT, on_signal, d);
  struct event *sigterm = evsignal_new(d->base, SIGTERM, on_signal, d);
  struct event *sighup = evsignal_new(d->base, SIGHUP, on_hup, d);
  event_add(sigint, NULL);
  event_add(sigterm, NULL);
  event_add(sighup, NULL);
  event_base_dispatch(d->base);
  event_free(sigint);
  event_free(sigterm);
  event_free(sighup);
  if (d->drain_ev) event_free(d->drain_ev);
  d->drain_ev = NULL;
}

static void lathed_teardown(lathed_t *d) {
  lt_metrics_server_destroy(d->worker_ops); /* before the roles they read */
  lt_metrics_server_destroy(d->publisher_ops);
  lt_worker_destroy(d->worker);
  lt_publisher_destroy(d->publisher);
  lt_scheduler_destroy(d->scheduler);
  lt_api_destroy(d->api);
  lt_api_destroy(d->sampler_api); /* before the backend it calls */
  lt_sampler_destroy(d->sampler);
  lt_tok_destroy(d->tok);
  for (int i = 0; i < 8; i++) lt_tok_destroy(d->toks[i].tok);
  lt_store_destroy(d->store);
  lt_recmac_key_destroy(d->tenant_mac);
  lt_crypto_kek_destroy(d->kek);
  lt_avro_registry_destroy(d->reg);
  lt_bus_conf_destroy(d->bus);
  for (int i = 0; i < 5; i++) lt_bus_conf_destroy(d->role_bus[i]);
  lt_embedded_stop(d->embedded); /* after every Kafka client */
  event_base_free(d->base);
}

/* libevent's own warnings as log lines (one format for every line on stderr). */
static void on_event_log(int severity, const char *msg) {
  lt_log(severity >= EVENT_LOG_ERR ? LT_LOG_ERROR : severity == EVENT_LOG_WARN ? LT_LOG_WARN : LT_LOG_DEBUG,
         NULL, NULL, "libevent: %s", msg);
}

/* The log format: --log-format, else LATHE_LOG_FORMAT, else text. JSON is exported, so that
 * the executors a worker spawns (lt_confine passes LATHE_LOG_FORMAT on) write JSON too. */
static void setup_log(const lathed_opts_t *o, const char *instance) {
  lt_log_format_t fmt = LT_LOG_TEXT;
  const char *env = getenv("LATHE_LOG_FORMAT");
  if (!(o->log_format && lt_log_format_parse(o->log_format, &fmt)) && env && !lt_log_format_parse(env, &fmt))
    fmt = LT_LOG_TEXT;
  lt_log_setup(fmt, o->role, instance);
  setenv("LATHE_LOG_FORMAT", fmt == LT_LOG_JSON ? "json" : "text", 1);
  event_set_log_callback(on_event_log);
}

/* A LATHE_ name in the environment that no setting has, a few edits from one that does, is
 * almost surely a typo that would leave the setting at its default: said, not refused (the
 * environment may hold other tools' LATHE_ names; --set and --config refuse unknown names). */
static void warn_env_typos(void) {
  for (char **e = environ; *e; e++) {
    const char *eq = strchr(*e, '=');
    if (strncmp(*e, "LATHE_", 6) != 0 || !eq || eq - *e >= 128) continue;
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
    /* two edits: LATHE_STACK_DIR (ops/stack's) is three from LATHE_STORE_DIR */
    const char *near = lt_conf_known(name) ? NULL : lt_conf_nearest(name, 2);
    if (near)
      lt_log_warn(NULL, "%s is set in the environment, but no setting has that name (did you mean %s?): not read",
                  name, near);
  }
}

int main(int argc, char **argv) {
  lathed_opts_t o;
  char cerr[640];
  /* --config FILE and --set NAME=VALUE become environment settings first (lt_conf.h). */
  if (lt_conf_from_args(&argc, argv, cerr, sizeof cerr)) {
    fprintf(stderr, "lathed: %s\n", cerr);
    return 2;
  }
  lathed_t d = {0};
  instance_name(d.instance, sizeof d.instance);
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0) return rc;
  /* setup_log exports the format it chose: a bad LATHE_LOG_FORMAT is refused below, after it */
  const char *lf = getenv("LATHE_LOG_FORMAT");
  lt_log_format_t lfmt;
  char serr[256] = "";
  if (lf && *lf && !lt_log_format_parse(lf, &lfmt))
    snprintf(serr, sizeof serr, "LATHE_LOG_FORMAT=\"%.40s\": expected text or json", lf);
  setup_log(&o, d.instance);
  if (o.role && strcmp(o.role, "executor") == 0) return lt_executor_main();
  /* SIGHUP reloads certificates (on_hup, once the loop runs): before and after that, ignored rather
   * than the default, which would end lathed in a way systemd's Restart=on-failure does not mend */
  signal(SIGHUP, SIG_IGN);
  warn_env_typos();
  if (serr[0] || settings_read(&d.set, serr, sizeof serr)) { /* before anything starts: nothing half up */
    lt_log_error(NULL, "%s", serr);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  evthread_use_pthreads();
  /* Buffers of 1 MiB and more (upload parts, store parts) are mapped and unmapped by themselves,
   * and a heap's free top over 1 MiB is returned. glibc's default threshold rises to the largest
   * buffer freed (up to 32 MiB), after which every part-sized buffer stays in a thread's heap:
   * the api's memory then never came back after uploads (tests/test_api_data.c). */
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 20);
  d.base = event_base_new();
  if (!d.base) {
    lt_log_error(NULL, "cannot create the event loop");
    return 1;
  }
  char err[640] = "";
  if (start_roles(&d, &o, err, sizeof err)) {
    lt_log_error(NULL, "%s", err);
    rc = 1;
  } else {
    run_until_signal(&d);
    rc = 0;
  }
  lathed_teardown(&d);
  return rc;
}
