/* lathed publisher against the real broker and S3 server of ops/stack.
 *
 * Each test makes its own topics (a fresh prefix, ops/topics.tsv), a fresh tenant with a real
 * wrapped data key in its TenantUpserted record, and writes the job's records with a plain
 * producer the way the API, the scheduler and the worker would: JobSubmitted, JobAccepted,
 * JobDispatched, AttemptStarted, sealed staging objects, CheckpointCommitted, JobCompleted. Then
 * a publisher runs on an event loop and the tests read lathe.artifacts back and decrypt what it
 * published. Every object key is under the test's own tenant id. */
#include <event2/event.h>
#include <event2/thread.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_dataset.h"
#include "lt_dataset_sweep.h"
#include "lt_publisher.h"
#include "lt_sealed.h"
#include "lt_store.h"
#include "lt_tenant.h"
#include "lt_test.h"

#define T_MS 20000

static char err[1024];
static lt_bus_conf_t *bus;
static lt_bus_admin_t *admin;
static lt_bus_producer_t *prod;
static lt_avro_registry_t *reg;
static lt_crypto_kek_t *kek;
static lt_crypto_dek_t *dek;
static lt_store_t *store;
static struct event_base *base;
static char tenant[64], topic_prefix[96];
static char topic_jobs[256], topic_control[256], topic_tenants[256];

/* ---------------------------------------------------------------- fixture */

static void setup(void) {
  evthread_use_pthreads();
  bus = lt_test_bus_scratch("tpub", topic_prefix, sizeof topic_prefix, &admin);
  lt_test_topics_create(bus, admin, T_MS);
  lt_bus_topic_name(bus, "jobs", topic_jobs, sizeof topic_jobs);
  lt_bus_topic_name(bus, "control", topic_control, sizeof topic_control);
  lt_bus_topic_name(bus, "tenants", topic_tenants, sizeof topic_tenants);
  cr_assert_eq(lt_bus_producer_new(bus, NULL, &prod, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);

  lt_store_s3_conf_t sc;
  cr_assert_eq(lt_store_s3_conf_from_env(&sc, err, sizeof err), LT_OK, "%s (run `eval \"$(ops/stack env)\"`)", err);
  cr_assert_eq(lt_store_s3_new(&store, &sc, err, sizeof err), LT_OK, "%s", err);

  /* A fresh tenant with a real wrapped data key, written as its TenantUpserted record. */
  char hex[65], rid[33];
  uint8_t raw[32];
  cr_assert_eq(lt_crypto_random(raw, sizeof raw), LT_OK);
  cr_assert_eq(lt_crypto_kek_from_text(&kek, "test-master", lt_crypto_hex(raw, 32, hex), err, sizeof err), LT_OK, "%s",
               err);
  cr_assert_eq(lt_crypto_random_id(rid), LT_OK);
  snprintf(tenant, sizeof tenant, "pt-%.12s", rid);
  cr_assert_eq(lt_crypto_dek_generate(&dek, tenant, "dek-1", err, sizeof err), LT_OK, "%s", err);
  lt_tenant_t t;
  memset(&t, 0, sizeof t);
  snprintf(t.tenant_id, sizeof t.tenant_id, "%s", tenant);
  snprintf(t.display_name, sizeof t.display_name, "%s", tenant);
  snprintf(t.data_key_id, sizeof t.data_key_id, "dek-1");
  t.weight = 1.0;
  cr_assert_eq(lt_crypto_dek_wrap(kek, dek, t.wrapped_data_key, sizeof t.wrapped_data_key, &t.wrapped_data_key_len,
                                  err, sizeof err),
               LT_OK, "%s", err);
  lt_avro_record_t *rec;
  const uint8_t *bytes;
  size_t len;
  cr_assert_eq(lt_avro_record_new(reg, "TenantUpserted", &rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_stamp(rec, "admin/test"), LT_OK);
  cr_assert_eq(lt_tenant_to_record(&t, rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_encode(rec, &bytes, &len, err, sizeof err), LT_OK, "%s", err);
  lt_bus_record_t r = {.topic = topic_tenants, .partition = LT_BUS_PARTITION_ANY, .key = tenant,
                       .key_size = strlen(tenant), .value = bytes, .value_size = len};
  cr_assert_eq(lt_bus_produce_sync(prod, &r, T_MS, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_avro_record_destroy(rec);
  base = event_base_new();
  cr_assert(base);
}

/* Staging objects of this tenant are removed; topics are deleted. */
static lt_err_t collect_key(void *ctx, const char *key, const lt_store_info_t *info) {
  (void)info;
  json_array_append_new(ctx, json_string(key));
  return LT_OK;
}

static json_t *list_keys(const char *prefix) {
  json_t *a = json_array();
  char next[LT_STORE_KEY_MAX + 1], after[LT_STORE_KEY_MAX + 1] = "";
  do {
    cr_assert_eq(lt_store_list(store, prefix, after, 0, collect_key, a, next, sizeof next, err, sizeof err), LT_OK, "%s",
                 err);
    snprintf(after, sizeof after, "%s", next);
  } while (next[0]);
  return a;
}

static void teardown(void) {
  char pfx[2][128];
  snprintf(pfx[0], sizeof pfx[0], "staging/%s/", tenant);
  snprintf(pfx[1], sizeof pfx[1], "tenants/%s/", tenant);
  for (int i = 0; i < 2 && store; i++) {
    json_t *keys = list_keys(pfx[i]);
    size_t k;
    json_t *v;
    json_array_foreach(keys, k, v) lt_store_delete(store, json_string_value(v), NULL, 0);
    json_decref(keys);
  }
  if (admin) lt_test_topics_delete(topic_prefix);
  lt_bus_producer_destroy(prod, 5000);
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(bus);
  lt_avro_registry_destroy(reg);
  lt_crypto_dek_destroy(dek);
  lt_crypto_kek_destroy(kek);
  lt_store_destroy(store);
  if (base) event_base_free(base);
}

TestSuite(publisher, .init = setup, .fini = teardown, .timeout = 240);

/* ---------------------------------------------------------------- records */

static lt_avro_record_t *rec_new(const char *type, const char *job) {
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_record_new(reg, type, &rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_stamp(rec, "test/publisher"), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "job_id", job), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "tenant_id", tenant), LT_OK);
  return rec;
}

/* Encodes, produces (acks=all) and frees rec. */
static void send_rec(lt_avro_record_t *rec, const char *topic, const char *job) {
  const uint8_t *bytes;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(rec, &bytes, &len, err, sizeof err), LT_OK, "%s", lt_avro_record_error(rec));
  lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = job, .key_size = strlen(job),
                       .value = bytes, .value_size = len};
  cr_assert_eq(lt_bus_produce_sync(prod, &r, T_MS, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_avro_record_destroy(rec);
}

static void send_attempt(const char *type, const char *job, int attempt) {
  lt_avro_record_t *rec = rec_new(type, job);
  cr_assert_eq(lt_avro_set_int(rec, "attempt", attempt), LT_OK);
  if (strcmp(type, "JobDispatched") == 0) {
    cr_assert_eq(lt_avro_set_string(rec, "worker_id", "w-1"), LT_OK);
    cr_assert_eq(lt_avro_set_long(rec, "lease_ms", 30000), LT_OK);
  }
  if (strcmp(type, "AttemptStarted") == 0) cr_assert_eq(lt_avro_set_string(rec, "worker_id", "w-1"), LT_OK);
  send_rec(rec, topic_control, job);
}

/* Submitted, accepted, dispatched and started under attempt 1. */
static void job_running(const char *job) {
  lt_avro_record_t *rec = rec_new("JobSubmitted", job);
  cr_assert_eq(lt_avro_set_string(rec, "base_model", "smollm2-135m"), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "dataset_id", "ds-1"), LT_OK);
  cr_assert_eq(lt_avro_set_int(rec, "gpus", 1), LT_OK);
  send_rec(rec, topic_jobs, job);
  rec = rec_new("JobAccepted", job);
  cr_assert_eq(lt_avro_set_int(rec, "gpus", 1), LT_OK);
  send_rec(rec, topic_control, job);
  send_attempt("JobDispatched", job, 1);
  send_attempt("AttemptStarted", job, 1);
}

/* A checkpoint as the worker stages it. */
typedef struct {
  int n;
  char names[6][64];
  char keys[6][LT_STORE_KEY_MAX + 1];
  char plain_sha[6][65];
  size_t plain_len[6];
  char sha256[65]; /* of the stored bytes, concatenated */
  int64_t bytes;
  char config_digest[65];
  char event_id[64];
  int attempt;
  int64_t step;
} ckpt_t;

static const char *const staged_names[6] = {"adapter_model.safetensors", "adapter_config.json", "state.bin",
                                            "eval.json", "metrics.json", "lathe_run.json"};

static bool legacy_run_name; /* stage the run configuration as config.json, its name before */

/* Stages the six objects; the object at index bad (or none when bad < 0) is sealed with another
 * data key of the same name, so it is well-formed and hashed into the commit but does not decrypt. */
static void stage_bad(const char *job, int attempt, int64_t step, ckpt_t *ck, int bad) {
  memset(ck, 0, sizeof *ck);
  ck->attempt = attempt;
  ck->step = step;
  lt_crypto_sha256_t *h;
  cr_assert_eq(lt_crypto_sha256_new(&h), LT_OK);
  uint8_t d[32];
  lt_crypto_sha256(job, strlen(job), d);
  lt_crypto_hex(d, 32, ck->config_digest);
  for (int i = 0; i < 6; i++) {
    size_t len = 0;
    char *plain = NULL;
    if (i == 0 || i == 2) { /* tensors and optimizer state: random bytes */
      len = i == 0 ? 300000 : 200000;
      plain = malloc(len);
      cr_assert_eq(lt_crypto_random(plain, len), LT_OK);
    } else if (i == 5) {
      plain = malloc(256);
      len = (size_t)snprintf(plain, 256, "{\"config_digest\":\"%s\",\"spec\":{\"job\":\"%s\",\"seed\":7}}",
                             ck->config_digest, job);
    } else {
      plain = malloc(128);
      len = (size_t)snprintf(plain, 128, "{\"file\":\"%s\",\"step\":%lld}", staged_names[i], (long long)step);
    }
    snprintf(ck->names[i], sizeof ck->names[i], "%s", staged_names[i]);
    const char *stored_as = i == 5 && legacy_run_name ? "config.json" : staged_names[i];
    cr_assert_eq(lt_publisher_staging_key(ck->keys[i], sizeof ck->keys[i], tenant, job, attempt, step, stored_as),
                 LT_OK);
    lt_crypto_dek_t *other = NULL;
    if (i == bad) cr_assert_eq(lt_crypto_dek_generate(&other, tenant, "dek-1", err, sizeof err), LT_OK, "%s", err);
    size_t cap = lt_crypto_sealed_size(dek, len, 0), slen = 0;
    uint8_t *sealed = malloc(cap);
    cr_assert_eq(lt_crypto_seal(other ? other : dek, ck->keys[i], 0, plain, len, sealed, cap, &slen, err, sizeof err),
                 LT_OK, "%s", err);
    lt_crypto_dek_destroy(other);
    cr_assert_eq(lt_store_put(store, ck->keys[i], sealed, slen, NULL, err, sizeof err), LT_OK, "%s", err);
    lt_crypto_sha256_update(h, sealed, slen);
    ck->bytes += (int64_t)slen;
    lt_crypto_sha256(plain, len, d);
    lt_crypto_hex(d, 32, ck->plain_sha[i]);
    ck->plain_len[i] = len;
    free(sealed);
    free(plain);
  }
  ck->n = 6;
  lt_crypto_sha256_final(h, d);
  lt_crypto_hex(d, 32, ck->sha256);
  lt_crypto_sha256_destroy(h);
}

static void stage(const char *job, int attempt, int64_t step, ckpt_t *ck) { stage_bad(job, attempt, step, ck, -1); }

/* CheckpointCommitted for ck under event_id, or a new event id (remembered in ck) when NULL. */
static void send_commit(const char *job, ckpt_t *ck, bool final, const char *event_id) {
  lt_avro_record_t *rec = rec_new("CheckpointCommitted", job);
  const char *ev;
  if (event_id) cr_assert_eq(lt_avro_set_string(rec, "event_id", event_id), LT_OK);
  cr_assert_eq(lt_avro_get_string(rec, "event_id", &ev, NULL), LT_OK);
  snprintf(ck->event_id, sizeof ck->event_id, "%s", ev);
  cr_assert_eq(lt_avro_set_int(rec, "attempt", ck->attempt), LT_OK);
  cr_assert_eq(lt_avro_set_long(rec, "step", ck->step), LT_OK);
  for (int i = 0; i < ck->n; i++) cr_assert_eq(lt_avro_array_append_string(rec, "object_keys", ck->keys[i]), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "sha256", ck->sha256), LT_OK);
  cr_assert_eq(lt_avro_set_long(rec, "bytes", ck->bytes), LT_OK);
  cr_assert_eq(lt_avro_set_bool(rec, "final", final), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "trigger", final ? "final" : "interval"), LT_OK);
  send_rec(rec, topic_control, job);
}

static void commit(const char *job, ckpt_t *ck, bool final) { send_commit(job, ck, final, NULL); }

/* The same CheckpointCommitted again (a duplicated delivery): same event id. */
static void commit_again(const char *job, ckpt_t *ck) { send_commit(job, ck, true, ck->event_id); }

static void complete(const char *job, const ckpt_t *ck, int attempt) {
  lt_avro_record_t *rec = rec_new("JobCompleted", job);
  cr_assert_eq(lt_avro_set_int(rec, "attempt", attempt), LT_OK);
  cr_assert_eq(lt_avro_set_long(rec, "step", ck->step), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "checkpoint_event_id", ck->event_id), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "checkpoint_sha256", ck->sha256), LT_OK);
  send_rec(rec, topic_control, job);
}

/* A job that ran under attempt 1 to a final commit at step and completed. */
static void completed_job(const char *job, int64_t step, ckpt_t *ck) {
  job_running(job);
  stage(job, 1, step, ck);
  commit(job, ck, true);
  complete(job, ck, 1);
}

/* ---------------------------------------------------------------- running and reading back */

static int keep_checkpoints; /* the publisher's conf.keep_checkpoints (0: its default) */

static int64_t retry_max_ms = 1000;

static lt_publisher_t *start(lt_store_t *s, const char *group, int64_t grace_ms) {
  lt_publisher_conf_t c = {.bus = bus, .store = s, .kek = kek, .registry = reg, .producer_id = "publisher/test",
                           .group_id = group, .gc_grace_ms = grace_ms, .gc_interval_ms = -1, .tick_ms = 50,
                           .retry_max_ms = retry_max_ms, .settle_ms = 1500, .keep_checkpoints = keep_checkpoints};
  lt_publisher_t *p;
  cr_assert_eq(lt_publisher_new(base, &c, &p, err, sizeof err), LT_OK, "%s", err);
  return p;
}

/* Runs the loop for ms milliseconds, or until done(p) is true. */
static bool run(lt_publisher_t *p, int ms, bool (*done)(lt_publisher_t *)) {
  for (int waited = 0; waited < ms; waited += 50) {
    struct timeval tv = {0, 50 * 1000};
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
    if (done && done(p)) return true;
  }
  return false;
}

static bool is_ready(lt_publisher_t *p) {
  lt_publisher_stats_t s;
  lt_publisher_stats(p, &s);
  return s.ready;
}

static bool settled(lt_publisher_t *p) {
  lt_publisher_stats_t s;
  lt_publisher_stats(p, &s);
  return s.ready && s.waiting == 0;
}

/* Runs a publisher on st (group NULL: the default) until until(p) (within 60 s), then extra_ms
 * more; its statistics at the end. */
static lt_publisher_stats_t run_publisher(lt_store_t *st, const char *group, bool (*until)(lt_publisher_t *),
                                          int extra_ms) {
  lt_publisher_t *p = start(st, group, 0);
  cr_assert(run(p, 60000, until), "the publisher did not settle");
  if (extra_ms) run(p, extra_ms, NULL);
  lt_publisher_stats_t s;
  lt_publisher_stats(p, &s);
  lt_publisher_destroy(p);
  return s;
}

/* Does a record name job (a DeadLetter names it in its reason)? */
static bool names_job(json_t *rec, const char *job) {
  bool dead = strcmp(json_string_value(json_object_get(rec, "type")), "DeadLetter") == 0;
  const char *v = lt_test_rs(rec, dead ? "reason" : "job_id");
  return v && (dead ? strstr(v, job) != NULL : strcmp(v, job) == 0);
}

/* Every record of type `type` of `job` in a topic (base name), as JSON, read from the beginning
 * until the topic is quiet for 1.5 s. */
static json_t *read_records(const char *topic, const char *type, const char *job) {
  lt_test_tail_t *t = lt_test_tail_open(bus, (const char *const[]){topic, NULL});
  lt_test_tail_settle(t, 1500);
  json_t *out = json_array(), *r;
  size_t i;
  json_array_foreach(lt_test_tail_records(t), i, r) {
    if (strcmp(json_string_value(json_object_get(r, "type")), type) == 0 && (!job || names_job(r, job)))
      json_array_append(out, json_object_get(r, "r"));
  }
  lt_test_tail_close(t);
  return out;
}

/* How many ArtifactPublished name job. */
static size_t count_published(const char *job) {
  json_t *pubs = read_records("artifacts", "ArtifactPublished", job);
  size_t n = json_array_size(pubs);
  json_decref(pubs);
  return n;
}

/* The publication has the right keys and plaintext hashes, and each published object decrypts
 * (with the tenant's key, under its artifact key) to the staged plaintext. */
/* The job's artifact key, unwrapped from its key.wrapped (caller destroys). */
static lt_crypto_dek_t *job_dek(const char *job) {
  char key[LT_STORE_KEY_MAX + 1];
  cr_assert_eq(lt_publisher_artifact_dek_key(key, sizeof key, tenant, job), LT_OK);
  void *blob;
  size_t len;
  lt_crypto_dek_t *d;
  cr_assert_eq(lt_store_get(store, key, LT_CRYPTO_WRAPPED_MAX, &blob, &len, NULL, err, sizeof err), LT_OK,
               "the job's artifact key %s: %s", key, err);
  cr_assert_eq(lt_crypto_dek_unwrap(kek, tenant, blob, len, &d, err, sizeof err), LT_OK, "%s", err);
  free(blob);
  return d;
}

/* The publication names every published object; each decrypts under the job's own artifact key
 * (and not under the tenant's, so destroying the job's key shreds them). */
static void assert_publication(json_t *pub, const char *job, const ckpt_t *ck) {
  lt_crypto_dek_t *jdek = job_dek(job);
  cr_assert_str_eq(json_string_value(json_object_get(pub, "checkpoint_event_id")), ck->event_id);
  cr_assert_str_eq(json_string_value(json_object_get(pub, "config_digest")), ck->config_digest);
  json_t *arts = json_object_get(pub, "artifacts");
  cr_assert_eq(json_array_size(arts), 5, "every staged object except state.bin is published");
  for (int i = 0; i < ck->n; i++) {
    json_t *found = NULL, *a;
    size_t k;
    json_array_foreach(arts, k, a) if (strcmp(json_string_value(json_object_get(a, "name")), ck->names[i]) == 0) found = a;
    if (strcmp(ck->names[i], "state.bin") == 0) {
      cr_assert_null(found, "state.bin must not be published");
      continue;
    }
    cr_assert_not_null(found, "%s is published", ck->names[i]);
    char want_key[LT_STORE_KEY_MAX + 1];
    snprintf(want_key, sizeof want_key, "tenants/%s/artifacts/%s/%s", tenant, job, ck->names[i]);
    cr_assert_str_eq(json_string_value(json_object_get(found, "key")), want_key);
    cr_assert_str_eq(json_string_value(json_object_get(found, "sha256")), ck->plain_sha[i]);
    cr_assert_eq(json_integer_value(json_object_get(found, "bytes")), (json_int_t)ck->plain_len[i]);
    void *data;
    size_t len;
    cr_assert_neq(lt_sealed_get(store, dek, want_key, 1 << 26, &data, &len, err, sizeof err), LT_OK,
                  "%s opens with the tenant's key", want_key);
    cr_assert_eq(lt_sealed_get(store, jdek, want_key, 1 << 26, &data, &len, err, sizeof err), LT_OK, "%s", err);
    uint8_t d[32];
    char hex[65];
    lt_crypto_sha256(data, len, d);
    cr_assert_str_eq(lt_crypto_hex(d, 32, hex), ck->plain_sha[i], "%s decrypts to the staged plaintext", want_key);
    free(data);
  }
  lt_crypto_dek_destroy(jdek);
}

static bool object_exists(const char *key) {
  lt_store_info_t info;
  return lt_store_head(store, key, &info, NULL, 0) == LT_OK;
}

/* ---------------------------------------------------------------- tests */

Test(publisher, completed_job_is_published_once_with_plaintext_hashes_and_decryptable_objects) {
  ckpt_t ck;
  completed_job("job-a", 100, &ck);
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 1000);
  cr_assert_eq(s.published, 1);
  cr_assert_eq(s.rejected, 0);
  json_t *pubs = read_records("artifacts", "ArtifactPublished", "job-a");
  cr_assert_eq(json_array_size(pubs), 1, "exactly one ArtifactPublished, got %zu", json_array_size(pubs));
  assert_publication(json_array_get(pubs, 0), "job-a", &ck);
  json_decref(pubs);
}

/* A checkpoint staged before the run configuration was renamed publishes it as lathe_run.json. */
Test(publisher, a_checkpoint_staged_with_the_old_config_name_publishes_it_renamed) {
  ckpt_t ck;
  legacy_run_name = true;
  completed_job("job-l", 30, &ck);
  legacy_run_name = false;
  cr_assert(strstr(ck.keys[5], "/config.json"), "%s", ck.keys[5]);
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 1000);
  cr_assert_eq(s.published, 1, "%s", s.last_errmsg);
  json_t *pubs = read_records("artifacts", "ArtifactPublished", "job-l");
  cr_assert_eq(json_array_size(pubs), 1);
  assert_publication(json_array_get(pubs, 0), "job-l", &ck);
  json_decref(pubs);
}

Test(publisher, duplicated_records_and_restarts_publish_nothing_different) {
  ckpt_t ck;
  completed_job("job-d", 50, &ck);
  run_publisher(store, NULL, settled, 0);
  json_t *first = read_records("artifacts", "ArtifactPublished", "job-d");
  cr_assert_eq(json_array_size(first), 1);

  /* The same commit and completion delivered again; a restart of the same group from scratch. */
  commit_again("job-d", &ck);
  complete("job-d", &ck, 1);
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 1000);
  cr_assert_eq(s.published, 0, "the restarted publisher published again");

  /* A restart that lost its offsets (another group): the projection shows it published. */
  char fresh[160]; /* under the test's prefix, where its principal may have groups */
  snprintf(fresh, sizeof fresh, "%spublisher-fresh", topic_prefix);
  s = run_publisher(store, fresh, settled, 1000);
  cr_assert_eq(s.published, 0, "a publisher without offsets published again");
  cr_assert_geq(s.already_published, 1);

  json_t *all = read_records("artifacts", "ArtifactPublished", "job-d");
  cr_assert_eq(json_array_size(all), 1, "one publication in all, got %zu", json_array_size(all));
  assert_publication(json_array_get(all, 0), "job-d", &ck);
  json_decref(first);
  json_decref(all);
}

Test(publisher, commit_of_a_fenced_attempt_is_never_promoted) {
  ckpt_t ck;
  job_running("job-f");
  stage("job-f", 1, 80, &ck);
  commit("job-f", &ck, true);
  send_attempt("JobDispatched", "job-f", 2); /* attempt 2 fences attempt 1 */
  complete("job-f", &ck, 1);                 /* the fenced attempt claims completion */
  send_attempt("AttemptStarted", "job-f", 2);
  complete("job-f", &ck, 2); /* attempt 2 completes naming attempt 1's checkpoint */
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 1000);
  cr_assert_eq(s.published, 0);
  cr_assert_eq(count_published("job-f"), 0, "nothing is published");
  char key[LT_STORE_KEY_MAX + 1];
  lt_publisher_artifact_key(key, sizeof key, tenant, "job-f", "adapter_model.safetensors");
  cr_assert(!object_exists(key), "nothing of the fenced attempt reaches the published prefix");
}

Test(publisher, cancel_recorded_before_completion_publishes_nothing) {
  ckpt_t ck;
  job_running("job-c");
  stage("job-c", 1, 10, &ck);
  commit("job-c", &ck, true);
  lt_avro_record_t *rec = rec_new("CancelRequested", "job-c");
  cr_assert_eq(lt_avro_set_string(rec, "requested_by", "customer"), LT_OK);
  send_rec(rec, topic_control, "job-c");
  complete("job-c", &ck, 1);
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 1000);
  cr_assert_eq(s.published, 0);
  cr_assert_eq(count_published("job-c"), 0, "nothing is published");
}

Test(publisher, tampered_staging_object_is_never_promoted_and_is_dead_lettered) {
  ckpt_t ck;
  completed_job("job-t", 20, &ck);
  /* Flip one byte of the stored adapter. */
  void *data;
  size_t len;
  cr_assert_eq(lt_store_get(store, ck.keys[0], 1 << 26, &data, &len, NULL, err, sizeof err), LT_OK, "%s", err);
  ((uint8_t *)data)[len / 2] ^= 0x01;
  cr_assert_eq(lt_store_put(store, ck.keys[0], data, len, NULL, err, sizeof err), LT_OK, "%s", err);
  free(data);
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 0);
  cr_assert_eq(s.published, 0);
  cr_assert_eq(s.rejected, 1);
  cr_assert_eq(s.last_err, LT_ERR_CORRUPT, "%s", s.last_errmsg);
  cr_assert_eq(count_published("job-t"), 0, "nothing is published");
  json_t *dead = read_records("deadletter", "DeadLetter", "job-t");
  cr_assert_eq(json_array_size(dead), 1, "one DeadLetter naming the job");
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(dead, 0), "error_code")), "LT_ERR_CORRUPT");
  json_decref(dead);
  char key[LT_STORE_KEY_MAX + 1];
  lt_publisher_artifact_key(key, sizeof key, tenant, "job-t", "adapter_config.json");
  cr_assert(!object_exists(key), "nothing is written to the published prefix");
}

/* A completion promoted through a store that fails as sc makes it fail (a failure of the store's,
 * not of the checkpoint's): nothing is published, it is tried again, never refused, and the last
 * error is want; then the real store publishes it. */
static void failing_store_then_the_real_one(const char *job, lt_store_s3_conf_t *sc, lt_err_t want) {
  ckpt_t ck;
  completed_job(job, 30, &ck);
  lt_store_t *failing;
  cr_assert_eq(lt_store_s3_new(&failing, sc, err, sizeof err), LT_OK, "%s", err);
  lt_publisher_stats_t s = run_publisher(failing, NULL, is_ready, 3000);
  lt_store_destroy(failing);
  cr_assert_eq(s.published, 0);
  cr_assert_eq(s.rejected, 0, "the store's failure was taken as a bad checkpoint: %s", s.last_errmsg);
  cr_assert_geq(s.retries, 1);
  cr_assert_eq(s.waiting, 1);
  cr_assert_eq(s.last_err, want, "%s: %s", lt_err_name(s.last_err), s.last_errmsg);
  cr_assert_eq(count_published(job), 0, "nothing is published");
  s = run_publisher(store, NULL, settled, 0);
  cr_assert_eq(s.published, 1);
  json_t *pubs = read_records("artifacts", "ArtifactPublished", job);
  cr_assert_eq(json_array_size(pubs), 1);
  assert_publication(json_array_get(pubs, 0), job, &ck);
  json_decref(pubs);
}

Test(publisher, store_unavailable_publishes_nothing_then_the_real_store_publishes) {
  lt_store_s3_conf_t sc; /* a store on a port where nothing listens */
  cr_assert_eq(lt_store_s3_conf_from_env(&sc, err, sizeof err), LT_OK);
  sc.endpoint = "127.0.0.1:1";
  sc.max_attempts = 2;
  sc.backoff_ms = 10;
  failing_store_then_the_real_one("job-s", &sc, LT_ERR_UNAVAILABLE);
}

/* A store that refuses the publisher's credentials (403, as while they rotate) is the store's
 * failure too. Before, it was refused for good: dead-lettered, its offset committed past, and the
 * job COMPLETED with no artifacts for ever. */
Test(publisher, a_store_refusing_the_credentials_is_retried_then_the_real_store_publishes) {
  lt_store_s3_conf_t sc;
  cr_assert_eq(lt_store_s3_conf_from_env(&sc, err, sizeof err), LT_OK);
  sc.secret_key = "not-the-secret";
  sc.max_attempts = 1;
  failing_store_then_the_real_one("job-403", &sc, LT_ERR_AUTH);
}

Test(publisher, gc_removes_orphans_after_the_grace_period_and_keeps_committed_checkpoints) {
  ckpt_t live, old, dead;
  job_running("job-g");
  stage("job-g", 1, 10, &old);
  commit("job-g", &old, false);
  stage("job-g", 1, 20, &live); /* newest commit of a running job: kept */
  commit("job-g", &live, false);
  job_running("job-x");
  stage("job-x", 1, 5, &dead); /* a failed job: collected */
  lt_avro_record_t *rec = rec_new("JobFailed", "job-x");
  cr_assert_eq(lt_avro_set_int(rec, "attempt", 1), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "code", "executor_failed"), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "reason", "test"), LT_OK);
  send_rec(rec, topic_control, "job-x");
  /* An upload of step 15 was never committed (step 20 was): garbage. One of step 30 may be a
   * checkpoint whose commit is late (a worker partitioned between upload and commit): kept. */
  char orphan[LT_STORE_KEY_MAX + 1], pending[LT_STORE_KEY_MAX + 1];
  cr_assert_eq(lt_publisher_staging_key(orphan, sizeof orphan, tenant, "job-g", 1, 15, "state.bin"), LT_OK);
  cr_assert_eq(lt_sealed_put(store, dek, orphan, "x", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_publisher_staging_key(pending, sizeof pending, tenant, "job-g", 1, 30, "state.bin"), LT_OK);
  cr_assert_eq(lt_sealed_put(store, dek, pending, "x", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  /* A training session's call bodies and results: kept while it lives, collected after its end.
   * Objects of a job this publisher has not folded yet (its records are on their way: a publisher
   * lagging on lathe.jobs deleted a published job's final checkpoint, chaos seed 2001): kept. */
  char live_call[LT_STORE_KEY_MAX + 1], dead_result[LT_STORE_KEY_MAX + 1], stray[LT_STORE_KEY_MAX + 1];
  snprintf(live_call, sizeof live_call, "sessions/%s/job-g/calls/c1", tenant);
  snprintf(dead_result, sizeof dead_result, "sessions/%s/job-x/results/1", tenant);
  snprintf(stray, sizeof stray, "sessions/%s/job-nobody/calls/c9", tenant);
  char unfolded[LT_STORE_KEY_MAX + 1];
  cr_assert_eq(lt_publisher_staging_key(unfolded, sizeof unfolded, tenant, "job-nobody", 1, 40, "state.bin"), LT_OK);
  const char *session_keys[4] = {live_call, dead_result, stray, unfolded};
  for (int i = 0; i < 4; i++)
    cr_assert_eq(lt_sealed_put(store, dek, session_keys[i], "x", 1, NULL, err, sizeof err), LT_OK, "%s", err);

  keep_checkpoints = -1; /* only the newest commit is kept: the superseded one is garbage */
  lt_publisher_t *p = start(store, NULL, 8000);
  cr_assert(run(p, 60000, is_ready));
  uint64_t deleted = 99;
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(deleted, 0, "nothing younger than the grace period is deleted");
  cr_assert(object_exists(orphan));
  sleep(9);
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  lt_publisher_destroy(p);
  cr_assert(!object_exists(orphan), "the orphan is collected");
  cr_assert(object_exists(pending), "an upload newer than the running job's newest commit is kept");
  for (int i = 0; i < live.n; i++) cr_assert(object_exists(live.keys[i]), "%s is kept", live.keys[i]);
  for (int i = 0; i < old.n; i++) cr_assert(!object_exists(old.keys[i]), "superseded %s is collected", old.keys[i]);
  for (int i = 0; i < dead.n; i++) cr_assert(!object_exists(dead.keys[i]), "failed job's %s is collected", dead.keys[i]);
  cr_assert(object_exists(live_call), "a running session's call body is kept");
  cr_assert(!object_exists(dead_result), "an ended session's result is collected after the grace period");
  cr_assert(object_exists(stray), "a session object of a job not folded yet is kept");
  cr_assert(object_exists(unfolded), "a staging object of a job not folded yet is kept");
  cr_assert_eq(deleted, 2 + (uint64_t)old.n + (uint64_t)dead.n);
}

/* Puts the given leaves of dataset id of the suite's tenant (any bytes: only their names count). */
static void dataset_objects(const char *id, const char *const *leaf_names) {
  char key[LT_STORE_KEY_MAX + 1];
  for (; *leaf_names; leaf_names++) {
    lt_dataset_object_key(key, sizeof key, tenant, id, *leaf_names);
    cr_assert_eq(lt_store_put(store, key, "x", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  }
}

static bool dataset_object_exists(const char *id, const char *leaf) {
  char key[LT_STORE_KEY_MAX + 1];
  lt_dataset_object_key(key, sizeof key, tenant, id, leaf);
  return object_exists(key);
}

/* A dataset exists once its meta is written, last: an API process that died between an upload's
 * data and its meta left objects no route lists, counted against the tenant's storage quota and
 * deleted by nothing. The GC now deletes a dataset's objects when one of the three is missing and
 * all are older than the grace period, at the second pass that finds it so: a complete dataset,
 * a young incomplete one (an upload may be completing) and names it does not know stay. */
Test(publisher, gc_sweeps_datasets_a_crash_left_without_their_meta) {
  lt_publisher_t *p = start(store, NULL, 8000);
  cr_assert(run(p, 60000, is_ready));
  /* after it is ready: the first pass below must find them young however long that took */
  dataset_objects("ds-whole", (const char *const[]){LT_DATASET_DATA, LT_DATASET_KEY, LT_DATASET_META, NULL});
  dataset_objects("ds-crashed", (const char *const[]){LT_DATASET_DATA, LT_DATASET_KEY, NULL});
  dataset_objects("ds-data-only", (const char *const[]){LT_DATASET_DATA, "notes.txt", NULL});
  dataset_objects("ds-meta-only", (const char *const[]){LT_DATASET_META, NULL}); /* a delete that died */
  uint64_t deleted = 0;
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  cr_assert(dataset_object_exists("ds-crashed", LT_DATASET_DATA), "nothing younger than the grace period goes");
  sleep(9);
  dataset_objects("ds-completing", (const char *const[]){LT_DATASET_DATA, NULL}); /* young */
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  cr_assert(dataset_object_exists("ds-crashed", LT_DATASET_DATA), "found old and incomplete once is not enough");
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  lt_publisher_stats_t st;
  lt_publisher_stats(p, &st);
  lt_publisher_destroy(p);
  const char *const leaves[3] = {LT_DATASET_DATA, LT_DATASET_KEY, LT_DATASET_META};
  for (int i = 0; i < 3; i++) {
    cr_expect(dataset_object_exists("ds-whole", leaves[i]), "a whole dataset's %s is kept", leaves[i]);
    cr_expect(!dataset_object_exists("ds-crashed", leaves[i]), "the crashed upload's %s is swept", leaves[i]);
  }
  cr_expect(!dataset_object_exists("ds-data-only", LT_DATASET_DATA), "data without key and meta is swept");
  cr_expect(dataset_object_exists("ds-data-only", "notes.txt"), "a name the sweep does not know stays");
  cr_expect(!dataset_object_exists("ds-meta-only", LT_DATASET_META), "a meta left by a delete is swept");
  cr_expect(dataset_object_exists("ds-completing", LT_DATASET_DATA), "a young incomplete dataset is kept");
  cr_expect_eq(st.datasets_swept, 4, "4 objects swept (%llu)", (unsigned long long)st.datasets_swept);
}

/* lt_dataset_sweep itself, listing two keys a page so that datasets straddle pages, everything
 * old (its clock a day ahead): the first pass deletes nothing, the second the datasets still
 * incomplete; one whose meta came between the passes (an upload that completed) stays, and so
 * do a whole dataset and a tenant whose id the swept one's is a prefix of. */
Test(publisher, dataset_sweep_groups_across_pages_and_keeps_to_its_tenant) {
  dataset_objects("ds-a", (const char *const[]){LT_DATASET_DATA, LT_DATASET_KEY, NULL});
  dataset_objects("ds-b", (const char *const[]){LT_DATASET_DATA, LT_DATASET_KEY, LT_DATASET_META, NULL});
  dataset_objects("ds-c", (const char *const[]){LT_DATASET_META, NULL});
  dataset_objects("ds-d", (const char *const[]){LT_DATASET_DATA, LT_DATASET_KEY, NULL});
  char other[80], key[LT_STORE_KEY_MAX + 1];
  snprintf(other, sizeof other, "%sb", tenant);
  lt_dataset_object_key(key, sizeof key, other, "ds-z", LT_DATASET_DATA);
  cr_assert_eq(lt_store_put(store, key, "x", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_map_t *suspects = lt_map_new(NULL);
  lt_dataset_sweep_conf_t conf = {
      .now_ms = lt_time_wall_ms() + 86400000, .grace_ms = 1000, .suspects = suspects, .pass = 1, .page = 2};
  uint64_t deleted = 9, kept = 0;
  cr_assert_eq(lt_dataset_sweep(store, tenant, &conf, &deleted, &kept, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(deleted, 0, "the first pass deletes nothing");
  cr_expect_eq(kept, 5, "ds-a, ds-c and ds-d are suspects (%llu objects)", (unsigned long long)kept);
  dataset_objects("ds-d", (const char *const[]){LT_DATASET_META, NULL}); /* its upload completed */
  conf.pass = 2;
  cr_assert_eq(lt_dataset_sweep(store, tenant, &conf, &deleted, &kept, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(deleted, 3, "ds-a's two objects and ds-c's meta (%llu)", (unsigned long long)deleted);
  const char *const leaves[3] = {LT_DATASET_DATA, LT_DATASET_KEY, LT_DATASET_META};
  for (int i = 0; i < 3; i++) {
    cr_expect(!dataset_object_exists("ds-a", leaves[i]) && !dataset_object_exists("ds-c", leaves[i]), "%s", leaves[i]);
    cr_expect(dataset_object_exists("ds-b", leaves[i]) && dataset_object_exists("ds-d", leaves[i]), "%s", leaves[i]);
  }
  cr_expect(object_exists(key), "tenant %s's dataset is not %s's", other, tenant);
  cr_expect_eq(lt_map_count(suspects), 0, "no suspect is left (%zu)", lt_map_count(suspects));
  lt_map_destroy(suspects);
  lt_store_delete(store, key, NULL, 0);
}

/* Attempt 2 of a job resumes from a commit (step 80) the publisher's view lacks: chaos seed 6528,
 * a publisher whose GC deleted the checkpoint a new attempt had resumed from, every step of it
 * fitting a publisher that never folded that commit. The commit is left out of the log here, the
 * dispatch still names it (as the scheduler's did): the publisher says so, and its GC and retention
 * keep step 80 as the commit it is, and retire the older ones as the log's order would. */
static void dispatch_resuming(const char *job, int attempt, int64_t step, const char *event_id) {
  lt_avro_record_t *rec = rec_new("JobDispatched", job);
  cr_assert_eq(lt_avro_set_int(rec, "attempt", attempt), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "worker_id", "w-2"), LT_OK);
  cr_assert_eq(lt_avro_set_long(rec, "lease_ms", 30000), LT_OK);
  cr_assert_eq(lt_avro_set_long(rec, "resume_step", step), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "resume_checkpoint_event_id", event_id), LT_OK);
  send_rec(rec, topic_control, job);
}

Test(publisher, a_resume_from_a_commit_it_never_folded_keeps_that_checkpoint_and_says_so) {
  ckpt_t ck[6]; /* steps 20, 40, 60, 80 (attempt 1), 100, 120 (attempt 2) */
  job_running("job-m");
  for (int i = 0; i < 4; i++) {
    stage("job-m", 1, 20 * (i + 1), &ck[i]);
    if (i < 3) commit("job-m", &ck[i], false);
  }
  dispatch_resuming("job-m", 2, 80, "6528-missed-commit");
  send_attempt("AttemptStarted", "job-m", 2);
  /* A job whose resume point the publisher did fold: nothing to say. */
  ckpt_t other;
  job_running("job-n");
  stage("job-n", 1, 10, &other);
  commit("job-n", &other, false);
  dispatch_resuming("job-n", 2, 10, other.event_id);
  /* Nor when it is not the newest (chaos seed 6944): the stopped attempt committed twice more
   * before the dispatch, decided on step 20, landed. Retention then follows the log. */
  ckpt_t lag[5]; /* steps 10, 20, 30, 40 (attempt 1), 50 (attempt 2, final) */
  job_running("job-l");
  for (int i = 0; i < 4; i++) {
    stage("job-l", 1, 10 * (i + 1), &lag[i]);
    commit("job-l", &lag[i], false);
    if (i == 1) send_attempt("AttemptStopped", "job-l", 1);
  }
  dispatch_resuming("job-l", 2, 20, lag[1].event_id);
  send_attempt("AttemptStarted", "job-l", 2);
  stage("job-l", 2, 50, &lag[4]);
  commit("job-l", &lag[4], true);
  complete("job-l", &lag[4], 2);

  keep_checkpoints = 2; /* the newest three commits */
  lt_publisher_t *p = start(store, NULL, 1); /* grace 1 ms: the GC judges everything at once */
  cr_assert(run(p, 60000, is_ready));
  sleep(1);
  uint64_t deleted = 0;
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  lt_publisher_stats_t st;
  lt_publisher_stats(p, &st);
  cr_expect_eq(st.unfolded_resumes, 1, "one dispatch resumed from a commit the publisher never folded, not %llu",
               (unsigned long long)st.unfolded_resumes);
  for (int c = 0; c < 4; c++)
    for (int i = 0; i < ck[c].n; i++)
      cr_expect_eq(object_exists(ck[c].keys[i]), c >= 1, "while attempt 2 runs, step %lld: %s should be %s",
                   (long long)ck[c].step, ck[c].keys[i], c >= 1 ? "kept" : "deleted");
  for (int i = 0; i < other.n; i++) cr_expect(object_exists(other.keys[i]), "%s is kept", other.keys[i]);
  for (int c = 0; c < 5; c++) /* published and pruned by the time the publisher was ready */
    for (int i = 0; i < lag[c].n; i++)
      cr_expect_eq(object_exists(lag[c].keys[i]), c >= 2, "a lagging dispatch: step %lld: %s should be %s",
                   (long long)lag[c].step, lag[c].keys[i], c >= 2 ? "kept" : "deleted");
  char *metrics = lt_publisher_metrics(p);
  cr_assert(metrics);
  cr_expect(strstr(metrics, "lathe_publisher_unfolded_resumes_total 1\n"), "%s", metrics);
  free(metrics);

  stage("job-m", 2, 100, &ck[4]);
  commit("job-m", &ck[4], false);
  stage("job-m", 2, 120, &ck[5]);
  commit("job-m", &ck[5], true);
  complete("job-m", &ck[5], 2);
  cr_assert(run(p, 60000, settled), "the publisher did not settle");
  lt_publisher_stats(p, &st);
  lt_publisher_destroy(p);
  cr_assert_eq(st.published, 2, "%s", st.last_errmsg);
  for (int c = 0; c < 6; c++)
    for (int i = 0; i < ck[c].n; i++)
      cr_expect_eq(object_exists(ck[c].keys[i]), c >= 3, "after completion, step %lld: %s should be %s",
                   (long long)ck[c].step, ck[c].keys[i], c >= 3 ? "kept" : "deleted");
}

/* Retention (lt_publisher.h): at completion a job keeps its final checkpoint and the newest
 * keep_checkpoints before it, whole; older ones (optimizer state included) and uploads never
 * committed are deleted as soon as the job is published, an hour's grace period or not. */
Test(publisher, completion_keeps_the_final_and_newest_n_checkpoints_and_deletes_the_rest_at_once) {
  ckpt_t ck[5];
  job_running("job-r");
  for (int i = 0; i < 5; i++) {
    stage("job-r", 1, 10 * (i + 1), &ck[i]);
    commit("job-r", &ck[i], i == 4);
  }
  char orphan[LT_STORE_KEY_MAX + 1]; /* an upload whose commit never came */
  cr_assert_eq(lt_publisher_staging_key(orphan, sizeof orphan, tenant, "job-r", 1, 45, "state.bin"), LT_OK);
  cr_assert_eq(lt_sealed_put(store, dek, orphan, "x", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  complete("job-r", &ck[4], 1);
  keep_checkpoints = 2;
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 0); /* grace: the default hour */
  cr_assert_eq(s.published, 1, "%s", s.last_errmsg);
  for (int c = 0; c < 5; c++)
    for (int i = 0; i < ck[c].n; i++) {
      bool kept = c >= 2; /* steps 30 and 40, and the final 50 */
      cr_expect_eq(object_exists(ck[c].keys[i]), kept, "step %lld: %s should be %s", (long long)ck[c].step,
                   ck[c].keys[i], kept ? "kept" : "deleted");
    }
  cr_expect(!object_exists(orphan), "an upload never committed is deleted");
  cr_expect_eq(s.pruned, 2 * (uint64_t)ck[0].n + 1, "pruned %llu", (unsigned long long)s.pruned);
  cr_expect_eq(count_published("job-r"), 1);
}

/* A training session's checkpoints are the states it saved by name (load_state may ask for any of
 * them while it lives): retention keeps them all until the session ends, then the final and the
 * newest keep_checkpoints, as for a job. */
Test(publisher, a_live_session_keeps_every_saved_state_and_its_end_keeps_the_newest_n) {
  ckpt_t ck[5];
  lt_avro_record_t *rec = rec_new("JobSubmitted", "ses-r");
  cr_assert_eq(lt_avro_set_string(rec, "base_model", "smollm2-135m"), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "dataset_id", ""), LT_OK);
  cr_assert_eq(lt_avro_set_enum(rec, "mode", "interactive"), LT_OK);
  send_rec(rec, topic_jobs, "ses-r");
  send_rec(rec_new("JobAccepted", "ses-r"), topic_control, "ses-r");
  send_attempt("JobDispatched", "ses-r", 1);
  send_attempt("AttemptStarted", "ses-r", 1);
  for (int i = 0; i < 4; i++) {
    stage("ses-r", 1, 10 * (i + 1), &ck[i]);
    commit("ses-r", &ck[i], false);
  }
  keep_checkpoints = 1;
  lt_publisher_t *p = start(store, NULL, 1); /* grace 1 ms: the GC judges everything at once */
  cr_assert(run(p, 60000, is_ready));
  sleep(1);
  uint64_t deleted = 0;
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  for (int c = 0; c < 4; c++)
    for (int i = 0; i < ck[c].n; i++) cr_expect(object_exists(ck[c].keys[i]), "a live session keeps %s", ck[c].keys[i]);
  stage("ses-r", 1, 50, &ck[4]);
  commit("ses-r", &ck[4], true);
  complete("ses-r", &ck[4], 1);
  cr_assert(run(p, 60000, settled), "the publisher did not settle");
  lt_publisher_stats_t st;
  lt_publisher_stats(p, &st);
  lt_publisher_destroy(p);
  cr_assert_eq(st.published, 1, "%s", st.last_errmsg);
  for (int c = 0; c < 5; c++)
    for (int i = 0; i < ck[c].n; i++)
      cr_expect_eq(object_exists(ck[c].keys[i]), c >= 3, "after the end, %s should be %s", ck[c].keys[i],
                   c >= 3 ? "kept" : "deleted");
}

/* A job its tenant deleted (JobDeleted in lathe.artifacts) before the publisher got to it is
 * never published, and the GC takes its staging objects whatever its state and however young (an
 * hour's grace here: they are seconds old; before, they stayed the hour). */
Test(publisher, a_deleted_job_is_never_published_and_its_staging_objects_go) {
  ckpt_t ck;
  completed_job("job-del", 10, &ck);
  lt_avro_record_t *rec = rec_new("JobDeleted", "job-del");
  cr_assert_eq(lt_avro_set_string(rec, "requested_by", "customer"), LT_OK);
  char topic_artifacts[256];
  lt_bus_topic_name(bus, "artifacts", topic_artifacts, sizeof topic_artifacts);
  send_rec(rec, topic_artifacts, "job-del");
  lt_publisher_t *p = start(store, NULL, 3600 * 1000);
  cr_assert(run(p, 60000, settled), "the publisher did not settle");
  uint64_t deleted = 0;
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  lt_publisher_stats_t s;
  lt_publisher_stats(p, &s);
  lt_publisher_destroy(p);
  cr_expect_eq(s.published, 0);
  cr_expect_eq(count_published("job-del"), 0, "nothing is published");
  char key[LT_STORE_KEY_MAX + 1];
  lt_publisher_artifact_key(key, sizeof key, tenant, "job-del", "adapter_model.safetensors");
  cr_expect(!object_exists(key), "no artifact is written");
  for (int i = 0; i < ck.n; i++) cr_expect(!object_exists(ck.keys[i]), "%s is collected", ck.keys[i]);
}

static bool tried_or_refused(lt_publisher_t *p) {
  lt_publisher_stats_t s;
  lt_publisher_stats(p, &s);
  return s.ready && (s.retries >= 2 || s.rejected > 0);
}

/* A DELETE removes a job's objects once its JobDeleted is on the log: a publisher promoting the
 * job may find a staged object gone before its fold reads the JobDeleted. It tries again, finds
 * the job deleted, and refuses nothing; before, it dead-lettered the customer's delete at once.
 * A staged object missing from a job that was not deleted is still refused, after its tries. */
Test(publisher, a_job_deleted_while_it_is_promoted_is_not_dead_lettered) {
  ckpt_t ck[2];
  completed_job("job-gone", 10, &ck[0]);
  completed_job("job-lost", 10, &ck[1]);
  for (int i = 0; i < 2; i++) cr_assert_eq(lt_store_delete(store, ck[i].keys[0], err, sizeof err), LT_OK, "%s", err);
  retry_max_ms = 2000; /* the service's back-off: 3.5 s of tries for the JobDeleted to be read */
  lt_publisher_t *p = start(store, NULL, 0);
  cr_assert(run(p, 60000, tried_or_refused), "the publisher did not try the jobs");
  lt_publisher_stats_t s;
  lt_publisher_stats(p, &s);
  cr_expect_eq(s.rejected, 0, "refused at the first try: %s", s.last_errmsg);
  lt_avro_record_t *rec = rec_new("JobDeleted", "job-gone");
  cr_assert_eq(lt_avro_set_string(rec, "requested_by", "customer"), LT_OK);
  char topic_artifacts[256];
  lt_bus_topic_name(bus, "artifacts", topic_artifacts, sizeof topic_artifacts);
  send_rec(rec, topic_artifacts, "job-gone");
  cr_assert(run(p, 60000, settled), "the publisher did not settle");
  lt_publisher_stats(p, &s);
  lt_publisher_destroy(p);
  cr_expect_eq(s.published, 0);
  cr_expect_eq(s.rejected, 1, "the job not deleted is refused, the deleted one is not (%llu)",
               (unsigned long long)s.rejected);
  json_t *dead = read_records("deadletter", "DeadLetter", "job-gone");
  cr_expect_eq(json_array_size(dead), 0, "the deleted job is dead-lettered");
  json_decref(dead);
  dead = read_records("deadletter", "DeadLetter", "job-lost");
  cr_expect_eq(json_array_size(dead), 1, "the job whose object is lost is dead-lettered once");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(dead, 0), "error_code")), "LT_ERR_NOT_FOUND");
  json_decref(dead);
}

/* A publisher promoting a job while its tenant's DELETE removed the job's objects writes them,
 * and the job's key, after the DELETE: the deleted job's artifacts decrypt again for whoever
 * holds the store. Stood in for by a job published, then deleted with no DELETE's objects
 * removed. The GC takes them at once, young as they are; another job's artifacts and those of
 * a job it has not folded stay. */
Test(publisher, artifacts_written_after_their_jobs_deletion_are_swept_with_its_key) {
  ckpt_t ck[2];
  completed_job("job-late", 10, &ck[0]);
  completed_job("job-live", 10, &ck[1]);
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 1000);
  cr_assert_eq(s.published, 2, "%s", s.last_errmsg);
  char unknown[LT_STORE_KEY_MAX + 1];
  lt_publisher_artifact_key(unknown, sizeof unknown, tenant, "job-not-folded", "adapter_model.safetensors");
  cr_assert_eq(lt_store_put(store, unknown, "x", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_avro_record_t *rec = rec_new("JobDeleted", "job-late");
  cr_assert_eq(lt_avro_set_string(rec, "requested_by", "customer"), LT_OK);
  char topic_artifacts[256];
  lt_bus_topic_name(bus, "artifacts", topic_artifacts, sizeof topic_artifacts);
  send_rec(rec, topic_artifacts, "job-late");

  char prefix[LT_STORE_KEY_MAX + 1], dek_key[LT_STORE_KEY_MAX + 1];
  snprintf(prefix, sizeof prefix, "tenants/%s/artifacts/job-late/", tenant);
  json_t *left = list_keys(prefix);
  size_t before = json_array_size(left);
  json_decref(left);
  cr_assert_geq(before, 6, "the deleted job's artifacts and key are in the store (%zu)", before);
  char staged[LT_STORE_KEY_MAX + 1];
  snprintf(staged, sizeof staged, "staging/%s/job-late/", tenant);
  left = list_keys(staged);
  size_t nstaged = json_array_size(left); /* its checkpoints retention kept: they go too, young as they are */
  json_decref(left);
  lt_publisher_t *p = start(store, NULL, 3600 * 1000); /* an hour's grace: they are minutes old */
  cr_assert(run(p, 60000, settled), "the publisher did not settle");
  uint64_t deleted = 0;
  cr_assert_eq(lt_publisher_gc(p, &deleted, err, sizeof err), LT_OK, "%s", err);
  lt_publisher_destroy(p);
  left = list_keys(prefix);
  cr_expect_eq(json_array_size(left), 0, "%zu of the deleted job's artifacts are left, the first %s",
               json_array_size(left), json_string_value(json_array_get(left, 0)));
  json_decref(left);
  cr_expect_eq(deleted, before + nstaged, "the GC deleted %llu objects, the job had %zu and %zu staged",
               (unsigned long long)deleted, before, nstaged);
  left = list_keys(staged);
  cr_expect_eq(json_array_size(left), 0, "the deleted job's staging objects are left");
  json_decref(left);
  lt_publisher_artifact_dek_key(dek_key, sizeof dek_key, tenant, "job-live");
  cr_expect(object_exists(dek_key), "the other job's key stays");
  snprintf(prefix, sizeof prefix, "tenants/%s/artifacts/job-live/", tenant);
  left = list_keys(prefix);
  cr_expect_eq(json_array_size(left), before, "the other job's artifacts stay");
  json_decref(left);
  cr_expect(object_exists(unknown), "an artifact of a job not folded yet stays");
  lt_crypto_dek_t *d = job_dek("job-live");
  lt_crypto_dek_destroy(d);
}

Test(publisher, object_that_does_not_decrypt_is_never_promoted) {
  ckpt_t ck;
  job_running("job-k");
  stage_bad("job-k", 1, 40, &ck, 5); /* lathe_run.json sealed with a different key: hash matches, tag does not */
  commit("job-k", &ck, true);
  complete("job-k", &ck, 1);
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 0);
  cr_assert_eq(s.published, 0);
  cr_assert_eq(s.rejected, 1);
  cr_assert_eq(s.last_err, LT_ERR_CORRUPT, "%s", s.last_errmsg);
  cr_assert(strstr(s.last_errmsg, "does not decrypt"), "%s", s.last_errmsg);
  cr_assert_eq(count_published("job-k"), 0, "nothing is published");
  char key[LT_STORE_KEY_MAX + 1];
  lt_publisher_artifact_key(key, sizeof key, tenant, "job-k", "adapter_model.safetensors");
  cr_assert(!object_exists(key), "no object is re-encrypted before the whole checkpoint verified");
}

/* Two publishers promote one completion at once (chaos seeds 2000 and 2001): each found no
 * key.wrapped, made the job's key, sealed the artifacts and wrote key.wrapped; the last writes
 * win. Replayed here in the order that broke it: the first publication lands, then the second
 * publisher's key and artifacts overwrite it. Every artifact must still open under the stored key,
 * which holds when both made the same key, whoever made it. */
Test(publisher, two_publishers_making_one_jobs_key_at_once_agree_on_it) {
  ckpt_t ck;
  completed_job("job-race", 40, &ck);
  lt_publisher_stats_t s = run_publisher(store, NULL, settled, 0);
  cr_assert_eq(s.published, 1);
  lt_crypto_dek_t *stored = job_dek("job-race"), *made = NULL;
  cr_assert_eq(lt_publisher_artifact_dek(dek, "job-race", &made, err, sizeof err), LT_OK, "%s", err);
  uint8_t a[LT_CRYPTO_KEY_BYTES], b[LT_CRYPTO_KEY_BYTES];
  lt_crypto_dek_export(stored, a);
  lt_crypto_dek_export(made, b);
  cr_assert(memcmp(a, b, sizeof a) == 0, "the second publisher would make another key for the job");

  /* The second publisher's writes: its wrapped key, then its artifacts, over the first's. */
  char key[LT_STORE_KEY_MAX + 1];
  uint8_t wrapped[LT_CRYPTO_WRAPPED_MAX];
  size_t wl;
  cr_assert_eq(lt_publisher_artifact_dek_key(key, sizeof key, tenant, "job-race"), LT_OK);
  cr_assert_eq(lt_crypto_dek_wrap(kek, made, wrapped, sizeof wrapped, &wl, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_store_put(store, key, wrapped, wl, NULL, err, sizeof err), LT_OK, "%s", err);
  const char *kv[6];
  for (int i = 0; i < 6; i++) kv[i] = ck.keys[i];
  lt_publisher_checkpoint_t c = {.tenant_id = tenant, .job_id = "job-race", .attempt = 1, .step = ck.step,
                                 .object_keys = kv, .nkeys = 6, .sha256_hex = ck.sha256, .bytes = (uint64_t)ck.bytes,
                                 .artifact_dek = made};
  lt_publisher_promotion_t *pr = malloc(sizeof *pr);
  cr_assert_eq(lt_publisher_promote(store, dek, &c, 1 << 26, pr, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(pr->n, 5);
  free(pr);
  lt_crypto_dek_destroy(made);
  lt_crypto_dek_destroy(stored);

  json_t *pubs = read_records("artifacts", "ArtifactPublished", "job-race");
  cr_assert_eq(json_array_size(pubs), 1);
  assert_publication(json_array_get(pubs, 0), "job-race", &ck); /* every object opens under key.wrapped */
  json_decref(pubs);

  /* Keys of other jobs, and of other tenants' keys, differ. */
  lt_crypto_dek_t *other_job = NULL, *other_tenant = NULL, *tdek = NULL;
  cr_assert_eq(lt_publisher_artifact_dek(dek, "job-race2", &other_job, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dek_generate(&tdek, "tenant-other", "dek-1", err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_publisher_artifact_dek(tdek, "job-race", &other_tenant, err, sizeof err), LT_OK, "%s", err);
  lt_crypto_dek_export(other_job, b);
  cr_assert(memcmp(a, b, sizeof a) != 0, "two jobs share an artifact key");
  lt_crypto_dek_export(other_tenant, b);
  cr_assert(memcmp(a, b, sizeof a) != 0, "two tenants' jobs of one id share an artifact key");
  cr_assert_str_eq(lt_crypto_dek_tenant(other_tenant), "tenant-other");
  cr_assert_eq(lt_publisher_artifact_dek(dek, "../x", &other_job, err, sizeof err), LT_ERR_INVALID);
  lt_crypto_dek_destroy(other_job);
  lt_crypto_dek_destroy(other_tenant);
  lt_crypto_dek_destroy(tdek);
}
