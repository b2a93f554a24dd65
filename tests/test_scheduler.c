/* test_scheduler: `lathed scheduler` against the real broker (ops/stack).
 *
 * Each test creates every topic of ops/topics.tsv under a prefix unique to the test, runs one or
 * more schedulers on its own event loop, produces what the API, upstream services and workers
 * would produce, reads back lathe.control / lathe.dispatch.* / lathe.deadletter, and deletes its
 * topics at the end. */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_job_record.h"
#include "lt_jobspec.h"
#include "lt_scheduler.h"
#include "lt_tenant.h"
#include "lt_test.h"
#include "lt_time.h"

static lt_bus_conf_t *conf;
static lt_bus_admin_t *admin;
static lt_avro_registry_t *reg;
static lt_bus_producer_t *prod;
static struct event_base *base;
static char prefix[96];
static char err[1024];

/* what the scheduler wrote, read back: control, every dispatch topic, deadletter */
static lt_test_tail_t *tail;
static const char *const tail_topics[] = {"control", "dispatch.production", "dispatch.standard",
                                          "dispatch.preemptible", "deadletter", NULL};

static void setup(void) {
  evthread_use_pthreads();
  conf = lt_test_bus_scratch("lt-sched-", prefix, sizeof prefix, &admin);
  lt_test_topics_create(conf, admin, 30000);
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_producer_new(conf, NULL, &prod, err, sizeof err), LT_OK, "%s", err);
  base = event_base_new();
  tail = lt_test_tail_open(conf, tail_topics);
}

static void teardown(void) {
  lt_test_tail_close(tail);
  lt_bus_producer_destroy(prod, 5000);
  if (admin) lt_test_topics_delete(prefix);
  lt_bus_admin_destroy(admin);
  lt_avro_registry_destroy(reg);
  lt_bus_conf_destroy(conf);
  event_base_free(base);
}

TestSuite(scheduler, .init = setup, .fini = teardown, .timeout = 180);

/* ---------------------------------------------------------------- helpers */

static void produce(const char *base_name, int32_t partition, const char *key, const void *v, size_t len) {
  char topic[256];
  lt_bus_topic_name(conf, base_name, topic, sizeof topic);
  lt_bus_record_t r = {.topic = topic, .partition = partition, .key = key, .key_size = key ? strlen(key) : 0,
                       .value = v, .value_size = len};
  cr_assert_eq(lt_bus_produce_sync(prod, &r, 10000, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
}

static void produce_rec(const char *base_name, int32_t partition, const char *key, lt_avro_record_t *rec) {
  const uint8_t *b;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(rec, &b, &len, err, sizeof err), LT_OK, "%s", err);
  produce(base_name, partition, key, b, len);
}

/* A TenantUpserted as the admin API writes it: fair-share weight and duration quota. */
static void put_tenant_weighted(const char *id, double weight, int64_t max_job_duration_s) {
  lt_tenant_t t;
  memset(&t, 0, sizeof t);
  snprintf(t.tenant_id, sizeof t.tenant_id, "%s", id);
  snprintf(t.display_name, sizeof t.display_name, "%s", id);
  t.weight = weight;
  t.quotas.max_job_duration_s = max_job_duration_s;
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_record_new(reg, "TenantUpserted", &rec, err, sizeof err), LT_OK);
  lt_avro_record_stamp(rec, "test");
  cr_assert_eq(lt_tenant_to_record(&t, rec, err, sizeof err), LT_OK, "%s", err);
  produce_rec("tenants", 0, id, rec);
  lt_avro_record_destroy(rec);
}

static void put_tenant(const char *id, int64_t max_job_duration_s) { put_tenant_weighted(id, 1, max_job_duration_s); }

/* A JobSubmitted of class cls stamped by producer, its spec edited by edit (may be NULL). */
static lt_avro_record_t *job_submitted(const char *producer, const char *job, const char *tenant, lt_job_class_t cls,
                                       int64_t max_duration_s, void (*edit)(lt_jobspec_t *)) {
  lt_jobspec_t spec;
  lt_jobspec_defaults(&spec);
  snprintf(spec.base_model, sizeof spec.base_model, "llama-test");
  snprintf(spec.dataset_id, sizeof spec.dataset_id, "ds-1");
  spec.priority = cls;
  spec.max_duration_s = max_duration_s;
  spec.gpus = 1;
  if (edit) edit(&spec);
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_record_new(reg, "JobSubmitted", &rec, err, sizeof err), LT_OK);
  lt_avro_record_stamp(rec, producer);
  lt_avro_set_string(rec, "job_id", job);
  lt_avro_set_string(rec, "tenant_id", tenant);
  cr_assert_eq(lt_jobspec_to_record(&spec, rec, err, sizeof err), LT_OK, "%s", err);
  return rec;
}

/* A JobSubmitted as the API writes it; spec edits through fn. */
static void submit(const char *job, const char *tenant, lt_job_class_t cls, void (*edit)(lt_jobspec_t *)) {
  lt_avro_record_t *rec = job_submitted("test-upstream", job, tenant, cls, 3600, edit);
  produce_rec("jobs", (int32_t)cls * 2, job, rec);
  lt_avro_record_destroy(rec);
}

static void control_rec(const char *type, const char *job, const char *tenant, int32_t attempt) {
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_record_new(reg, type, &rec, err, sizeof err), LT_OK);
  lt_avro_record_stamp(rec, "test");
  lt_avro_set_string(rec, "job_id", job);
  lt_avro_set_string(rec, "tenant_id", tenant);
  if (strcmp(type, "CancelRequested") == 0) lt_avro_set_string(rec, "requested_by", "customer");
  else lt_avro_set_int(rec, "attempt", attempt);
  produce_rec("control", LT_BUS_PARTITION_ANY, job, rec);
  lt_avro_record_destroy(rec);
}

/* A heartbeat of worker (slots free), in node group `group` reachable at `rdv` (NULL: none), and
 * whether it drains. */
static lt_avro_record_t *heartbeat_rec(const char *worker, int slots, const char *group, const char *rdv,
                                       bool draining) {
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_record_new(reg, "WorkerHeartbeat", &rec, err, sizeof err), LT_OK);
  lt_avro_record_stamp(rec, "test-worker");
  lt_avro_set_string(rec, "worker_id", worker);
  lt_avro_set_string(rec, "backend", "cpu");
  lt_avro_set_int(rec, "slots_total", slots);
  lt_avro_set_int(rec, "slots_free", slots);
  lt_avro_set_long(rec, "memory_total_bytes", 1LL << 34);
  lt_avro_set_long(rec, "memory_free_bytes", 1LL << 34);
  lt_avro_array_append_string(rec, "base_models", "llama-test");
  lt_avro_set_bool(rec, "draining", draining);
  if (group) lt_avro_set_string(rec, "node_group", group);
  if (rdv) lt_avro_set_string(rec, "rendezvous", rdv);
  return rec;
}

static void heartbeat_of(const char *worker, int slots, const char *group, const char *rdv, bool draining) {
  lt_avro_record_t *rec = heartbeat_rec(worker, slots, group, rdv, draining);
  produce_rec("workers", LT_BUS_PARTITION_ANY, worker, rec);
  lt_avro_record_destroy(rec);
}

/* A heartbeat of worker (slots free) owning partition `part` of the first `classes` dispatch
 * topics (production, standard, preemptible), as a worker the group assigned them to says. */
static void heartbeat_owning(const char *worker, int slots, int part, int classes) {
  lt_avro_record_t *rec = heartbeat_rec(worker, slots, NULL, NULL, false);
  for (int c = 0; c < classes && c < 3; c++) {
    char topic[256], path[64];
    lt_bus_topic_name(conf, tail_topics[1 + c], topic, sizeof topic);
    size_t i = 0;
    cr_assert_eq(lt_avro_array_append(rec, "owned_partitions", &i), LT_OK);
    snprintf(path, sizeof path, "owned_partitions[%zu].topic", i);
    lt_avro_set_string(rec, path, topic);
    snprintf(path, sizeof path, "owned_partitions[%zu].partition", i);
    lt_avro_set_int(rec, path, part);
  }
  produce_rec("workers", LT_BUS_PARTITION_ANY, worker, rec);
  lt_avro_record_destroy(rec);
}

static void heartbeat(const char *worker, int slots) { heartbeat_of(worker, slots, NULL, NULL, false); }

static const char *dispatch_log(const char *topic_base);

/* Is r (a tail record) of type (and job, and topic base, when not NULL)? */
static bool seen_is(json_t *r, const char *type, const char *job, const char *topic_base) {
  if (strcmp(json_string_value(json_object_get(r, "type")), type) != 0) return false;
  const char *jid = lt_test_rs(r, "job_id");
  if (job && (!jid || strcmp(jid, job) != 0)) return false;
  return !topic_base || strcmp(json_string_value(json_object_get(r, "topic")), topic_base) == 0;
}

/* Records of type (and job, and topic base when not NULL) read back so far. */
static int count_seen(const char *type, const char *job, const char *topic_base) {
  int n = 0;
  size_t i;
  json_t *r;
  json_array_foreach(lt_test_tail_records(tail), i, r) n += seen_is(r, type, job, topic_base);
  return n;
}

/* The nth such record's fields. */
static json_t *find_seen(const char *type, const char *job, const char *topic_base, int nth) {
  size_t i;
  json_t *r;
  json_array_foreach(lt_test_tail_records(tail), i, r) {
    if (seen_is(r, type, job, topic_base) && nth-- == 0) return json_object_get(r, "r");
  }
  return NULL;
}

/* Runs the loop until cond() or timeout; returns cond(). */
static bool run_until(bool (*cond)(void *), void *ctx, int timeout_ms) {
  int64_t end = lt_time_wall_ms() + timeout_ms;
  while (lt_time_wall_ms() < end) {
    event_base_loop(base, EVLOOP_NONBLOCK);
    lt_test_tail_poll(tail, 0);
    if (cond(ctx)) return true;
    usleep(10000);
  }
  return cond(ctx);
}

static bool never(void *ctx) {
  (void)ctx;
  return false;
}

/* Lets the scheduler run for ms with nothing new produced, reading back all it writes: what it
 * has not written by then, it was not going to write on its own. */
static void settle(int ms) { run_until(never, NULL, ms); }

typedef struct {
  const char *type, *job, *topic;
  int n;
} want_t;

static bool have(void *ctx) {
  want_t *w = ctx;
  return count_seen(w->type, w->job, w->topic) >= w->n;
}

static bool wait_for(const char *type, const char *job, const char *topic, int n, int timeout_ms) {
  want_t w = {type, job, topic, n};
  return run_until(have, &w, timeout_ms);
}

static bool is_leading(void *ctx) {
  lt_scheduler_stats_t st;
  lt_scheduler_stats(ctx, &st);
  return st.role == LT_SCHEDULER_LEADING;
}

static lt_scheduler_t *start(const char *group, lt_scheduler_conf_t *over) {
  lt_scheduler_conf_t c = {.bus = conf, .registry = reg, .producer_id = "scheduler/test", .lease_ms = 60000,
                           .tenant_grace_ms = 1000, .tick_ms = 50};
  if (over) {
    c = *over;
    c.bus = conf;
    c.registry = reg;
  }
  char g[200];
  if (group) {
    snprintf(g, sizeof g, "%s%s", prefix, group);
    c.group_id = g;
  }
  lt_scheduler_t *s;
  cr_assert_eq(lt_scheduler_new(base, &c, &s, err, sizeof err), LT_OK, "%s", err);
  cr_assert(run_until(is_leading, s, 30000), "the scheduler did not start leading within 30 s");
  return s;
}

/* Replays lathe.jobs + lathe.control like `lathe admin replay` and returns the digest. */
static void replay_digest(char out[65]) {
  lt_proj_t *f;
  cr_assert_eq(lt_proj_new(reg, &f, err, sizeof err), LT_OK);
  lt_bus_consumer_t *c;
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &c, err, sizeof err), LT_OK);
  char t1[200], t2[200];
  lt_bus_topic_name(conf, "jobs", t1, sizeof t1);
  lt_bus_topic_name(conf, "control", t2, sizeof t2);
  lt_bus_tp_t tps[12];
  for (int p = 0; p < 6; p++) {
    tps[p] = (lt_bus_tp_t){t1, p, LT_BUS_OFFSET_BEGINNING};
    tps[6 + p] = (lt_bus_tp_t){t2, p, LT_BUS_OFFSET_BEGINNING};
  }
  cr_assert_eq(lt_bus_consumer_assign(c, tps, 12, err, sizeof err), LT_OK);
  int64_t quiet = lt_time_wall_ms();
  while (lt_time_wall_ms() - quiet < 1500) {
    const lt_bus_msg_t *m = NULL;
    cr_assert_eq(lt_bus_consumer_poll(c, 100, &m, err, sizeof err), LT_OK, "%s", err);
    if (!m) continue;
    quiet = lt_time_wall_ms();
    size_t len;
    const void *v = lt_bus_msg_value(m, &len);
    if (v) lt_proj_fold(f, v, len, NULL, NULL, NULL, 0);
  }
  lt_job_digest(lt_proj_jobs(f), out);
  lt_bus_consumer_destroy(c);
  lt_proj_destroy(f);
}

/* ---------------------------------------------------------------- tests */

static void bad_lr(lt_jobspec_t *s) { s->hp.learning_rate = 5; }

/* An upstream service writes JobSubmitted with plain librdkafka (not lt_bus). */
static void upstream_produce(const char *job, const char *tenant) {
  lt_avro_record_t *rec = job_submitted("upstream-billing", job, tenant, LT_CLASS_STANDARD, 600, NULL);
  const uint8_t *b;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(rec, &b, &len, err, sizeof err), LT_OK);
  rd_kafka_conf_t *rc = rd_kafka_conf_new();
  char e2[512];
  cr_assert_eq(rd_kafka_conf_set(rc, "bootstrap.servers", lt_bus_conf_get(conf, "bootstrap.servers"), e2, sizeof e2),
               RD_KAFKA_CONF_OK);
  rd_kafka_conf_set(rc, "acks", "all", e2, sizeof e2);
  lt_test_rd_conf_auth(rc, "admin");
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, rc, e2, sizeof e2);
  cr_assert(rk, "%s", e2);
  char topic[256];
  lt_bus_topic_name(conf, "jobs", topic, sizeof topic);
  cr_assert_eq(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(2), RD_KAFKA_V_KEY(job, strlen(job)),
                                 RD_KAFKA_V_VALUE((void *)b, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                 RD_KAFKA_V_END),
               RD_KAFKA_RESP_ERR_NO_ERROR);
  cr_assert_eq(rd_kafka_flush(rk, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_destroy(rk);
  lt_avro_record_destroy(rec);
}

Test(scheduler, upstream_submissions_are_accepted_or_rejected_naming_the_field) {
  put_tenant("acme", 0);
  upstream_produce("job-up-1", "acme");
  submit("job-bad-lr", "acme", LT_CLASS_STANDARD, bad_lr);
  submit("job-nobody", "no-such-tenant", LT_CLASS_STANDARD, NULL);
  lt_scheduler_t *s = start(NULL, NULL);
  cr_assert(wait_for("JobAccepted", "job-up-1", "control", 1, 20000), "no JobAccepted for the upstream job");
  cr_assert(wait_for("JobRejected", "job-bad-lr", "control", 1, 20000), "no JobRejected for the bad job");
  json_t *r = find_seen("JobRejected", "job-bad-lr", NULL, 0);
  cr_assert_str_eq(json_string_value(json_object_get(r, "field")), "hyperparameters.learning_rate");
  cr_assert(strstr(json_string_value(json_object_get(r, "reason")), "learning_rate"), "reason: %s",
            json_string_value(json_object_get(r, "reason")));
  cr_assert(wait_for("JobRejected", "job-nobody", "control", 1, 20000), "no JobRejected for the unknown tenant");
  r = find_seen("JobRejected", "job-nobody", NULL, 0);
  cr_assert_str_eq(json_string_value(json_object_get(r, "code")), "unknown_tenant");
  cr_assert_str_eq(json_string_value(json_object_get(r, "field")), "tenant_id");
  cr_assert_eq(count_seen("JobAccepted", "job-bad-lr", NULL), 0);
  lt_scheduler_destroy(s);
}

Test(scheduler, over_the_tenants_duration_limit_is_rejected) {
  put_tenant("short", 60);
  submit("job-long", "short", LT_CLASS_STANDARD, NULL); /* asks 3600 s */
  lt_scheduler_t *s = start(NULL, NULL);
  cr_assert(wait_for("JobRejected", "job-long", "control", 1, 20000));
  json_t *r = find_seen("JobRejected", "job-long", NULL, 0);
  cr_assert_str_eq(json_string_value(json_object_get(r, "field")), "max_duration_s");
  lt_scheduler_destroy(s);
}

Test(scheduler, garbage_bytes_go_to_deadletter_and_the_fold_goes_on) {
  put_tenant("acme", 0);
  lt_scheduler_t *s = start(NULL, NULL);
  const char garbage[] = "\xc3\x01not avro at all, and not JSON either";
  produce("jobs", 3, "junk-key", garbage, sizeof garbage - 1);
  submit("job-after-junk", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("DeadLetter", NULL, "deadletter", 1, 20000), "no DeadLetter");
  json_t *d = find_seen("DeadLetter", NULL, "deadletter", 0);
  cr_assert(strstr(json_string_value(json_object_get(d, "topic")), "jobs"));
  cr_assert_eq(json_integer_value(json_object_get(d, "partition")), 3);
  cr_assert_eq(json_integer_value(json_object_get(d, "offset")), 0);
  cr_assert_str_eq(json_string_value(json_object_get(d, "key")), "junk-key");
  cr_assert(wait_for("JobAccepted", "job-after-junk", "control", 1, 20000), "the fold stopped after the junk");
  lt_scheduler_destroy(s);
  /* a new leader does not dead-letter it again: the offset went with the DeadLetter */
  s = start(NULL, NULL);
  submit("job-after-restart", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobAccepted", "job-after-restart", "control", 1, 20000));
  cr_assert_eq(count_seen("DeadLetter", NULL, "deadletter"), 1);
  lt_scheduler_destroy(s);
}

/* A record nearly as large as its topic takes: its whole copy in a DeadLetter would be over the
 * producer's limit, the transaction carrying it would fail, and every new term would meet it again. */
Test(scheduler, a_record_near_the_size_limit_is_dead_lettered_cut_and_the_fold_goes_on) {
  put_tenant("acme", 0);
  size_t big = 999900;
  char *junk = malloc(big);
  cr_assert(junk);
  memset(junk, 'j', big);
  produce("workers", 0, "junk-worker", junk, big);
  free(junk);
  lt_scheduler_t *s = start(NULL, NULL);
  submit("job-after-big-junk", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobAccepted", "job-after-big-junk", "control", 1, 30000), "the fold stopped at the large record");
  cr_assert(wait_for("DeadLetter", NULL, "deadletter", 1, 20000), "no DeadLetter");
  json_t *d = find_seen("DeadLetter", NULL, "deadletter", 0);
  const char *reason = json_string_value(json_object_get(d, "reason"));
  cr_assert(reason && strstr(reason, "the first 65536 of the payload's 999900 bytes"), "reason: %s", reason);
  cr_assert_str_eq(json_string_value(json_object_get(d, "key")), "junk-worker");
  lt_scheduler_destroy(s);
}

Test(scheduler, heartbeat_dispatches_to_the_class_topic_with_attempt_1) {
  put_tenant("acme", 0);
  submit("job-prod", "acme", LT_CLASS_PRODUCTION, NULL);
  lt_scheduler_t *s = start(NULL, NULL);
  cr_assert(wait_for("JobAccepted", "job-prod", "control", 1, 20000));
  cr_assert_eq(count_seen("JobDispatched", "job-prod", NULL), 0, "dispatched with no worker");
  heartbeat("w1", 2);
  cr_assert(wait_for("JobDispatched", "job-prod", "dispatch.production", 1, 20000), "no dispatch");
  cr_assert(wait_for("JobDispatched", "job-prod", "control", 1, 5000));
  json_t *d = find_seen("JobDispatched", "job-prod", "dispatch.production", 0);
  cr_assert_eq(json_integer_value(json_object_get(d, "attempt")), 1);
  cr_assert_str_eq(json_string_value(json_object_get(d, "worker_id")), "w1");
  cr_assert_str_eq(json_string_value(json_object_get(d, "base_model")), "llama-test");
  cr_assert_eq(count_seen("JobDispatched", "job-prod", "dispatch.standard"), 0);
  lt_scheduler_destroy(s);
}

static bool all_dispatched(void *ctx) {
  int n = *(int *)ctx;
  char id[32];
  for (int i = 0; i < n; i++) {
    snprintf(id, sizeof id, "job-%02d", i);
    if (count_seen("JobDispatched", id, "control") < 1) return false;
  }
  return true;
}

Test(scheduler, a_restart_mid_stream_duplicates_no_dispatch_and_keeps_the_digest) {
  put_tenant("acme", 0);
  heartbeat("w1", 16);
  lt_scheduler_t *s = start(NULL, NULL);
  char id[32];
  for (int i = 0; i < 6; i++) {
    snprintf(id, sizeof id, "job-%02d", i);
    submit(id, "acme", LT_CLASS_STANDARD, NULL);
  }
  int n = 6;
  cr_assert(run_until(all_dispatched, &n, 30000), "the first scheduler did not dispatch its jobs");
  control_rec("AttemptStarted", "job-00", "acme", 1);
  lt_scheduler_destroy(s); /* killed mid-stream: more work arrives while none leads */
  for (int i = 6; i < 10; i++) {
    snprintf(id, sizeof id, "job-%02d", i);
    submit(id, "acme", LT_CLASS_STANDARD, NULL);
  }
  s = start(NULL, NULL);
  n = 10;
  cr_assert(run_until(all_dispatched, &n, 30000), "the second scheduler did not dispatch the new jobs");
  settle(1500); /* nothing more may be written */
  for (int i = 0; i < 10; i++) {
    snprintf(id, sizeof id, "job-%02d", i);
    cr_assert_eq(count_seen("JobDispatched", id, "control"), 1, "%s dispatched more than once", id);
    cr_assert_eq(count_seen("JobAccepted", id, "control"), 1, "%s accepted more than once", id);
    cr_assert_eq(json_integer_value(json_object_get(find_seen("JobDispatched", id, "control", 0), "attempt")), 1);
  }
  char live[65], replayed[65];
  cr_assert_eq(lt_scheduler_digest(s, live), LT_OK);
  replay_digest(replayed);
  cr_assert_str_eq(live, replayed);
  lt_scheduler_destroy(s);
}

Test(scheduler, a_second_instance_with_the_same_transactional_id_fences_the_first) {
  put_tenant("acme", 0);
  lt_scheduler_t *a = start("group-a", NULL);
  /* B leads its own group with the same transactional id: its init fences A's producer */
  lt_scheduler_t *b = start("group-b", NULL);
  submit("job-fence", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobAccepted", "job-fence", "control", 1, 20000));
  lt_scheduler_stats_t st;
  /* up to 30 s: A is fenced at its first write after B's init, which waits for A's group to form
   * and to read the submission; 2 s, then 10 s, each missed once in the sanitizer build beside a
   * busy CI. The loop ends as soon as it is fenced. */
  for (int i = 0; i < 3000; i++) {
    lt_scheduler_stats(a, &st);
    if (st.fenced) break;
    event_base_loop(base, EVLOOP_NONBLOCK);
    usleep(10000);
  }
  lt_scheduler_stats(a, &st);
  cr_assert(st.fenced, "the first instance was not fenced");
  cr_assert_neq(st.role, LT_SCHEDULER_LEADING, "a fenced instance still leads");
  cr_assert_geq(st.txn_failures, 1);
  lt_test_tail_poll(tail, 0);
  cr_assert_eq(count_seen("JobAccepted", "job-fence", "control"), 1, "the fenced instance's write is visible");
  lt_scheduler_stats(b, &st);
  cr_assert_eq(st.role, LT_SCHEDULER_LEADING);
  lt_scheduler_destroy(a);
  lt_scheduler_destroy(b);
}

Test(scheduler, a_dispatch_not_started_in_time_is_dispatched_again_as_attempt_2) {
  put_tenant("acme", 0);
  heartbeat("w1", 2);
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50,
                           .start_timeout_ms = 1500};
  lt_scheduler_t *s = start(NULL, &c);
  submit("job-slow", "acme", LT_CLASS_PREEMPTIBLE, NULL);
  cr_assert(wait_for("JobDispatched", "job-slow", "dispatch.preemptible", 1, 20000));
  cr_assert(wait_for("JobDispatched", "job-slow", "dispatch.preemptible", 2, 20000), "not dispatched again");
  cr_assert_eq(json_integer_value(json_object_get(find_seen("JobDispatched", "job-slow", "control", 0), "attempt")), 1);
  cr_assert_eq(json_integer_value(json_object_get(find_seen("JobDispatched", "job-slow", "control", 1), "attempt")), 2);
  lt_scheduler_destroy(s);
}

/* A worker starts a dispatch after the start timeout (it read it late, or its slot freed late):
 * lt_sched had put the job back in its queue, and its next DISPATCH row met a running job and
 * dropped it, so the job ran unbooked and its slot looked free. Now a running job that lt_sched
 * does not hold running is booked where it runs: the slot is not given to another job. */
Test(scheduler, a_job_started_after_its_start_timeout_keeps_its_slot) {
  put_tenant("acme", 0);
  heartbeat("w1", 1);
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50,
                           .start_timeout_ms = 1500};
  lt_scheduler_t *s = start(NULL, &c);
  submit("job-late", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobDispatched", "job-late", "control", 1, 20000));
  heartbeat_of("w1", 1, NULL, NULL, true); /* no redispatch meanwhile: w1 drains */
  settle(3000);                            /* past the start timeout: lt_sched requeued it */
  cr_assert_eq(count_seen("JobDispatched", "job-late", "control"), 1, "dispatched again while w1 drained");
  control_rec("AttemptStarted", "job-late", "acme", 1); /* w1 starts it, late */
  settle(1000);
  heartbeat("w1", 1); /* and takes work again */
  submit("job-next", "acme", LT_CLASS_STANDARD, NULL);
  settle(3000);
  cr_assert_eq(count_seen("JobDispatched", "job-next", "control"), 0,
               "the slot job-late runs in was given to another job: %s", dispatch_log("control"));
  cr_assert_eq(count_seen("JobDispatched", "job-late", "control"), 1, "%s", dispatch_log("control"));
  control_rec("JobCompleted", "job-late", "acme", 1);
  cr_assert(wait_for("JobDispatched", "job-next", "control", 1, 20000), "the slot freed was not given: %s",
            dispatch_log("control"));
  lt_scheduler_destroy(s);
}

/* Heartbeats of worker every 500 ms, n times (a worker_timeout_ms of 1.5 s keeps it up). */
static void beating(const char *worker, int n) {
  for (int i = 0; i < n; i++) {
    heartbeat(worker, 1);
    settle(500);
  }
}

/* Heartbeats of worker every 500 ms until job is dispatched (20 s at most): whether it was. */
static bool beating_until_dispatched(const char *worker, const char *job) {
  for (int i = 0; i < 40; i++) {
    heartbeat(worker, 1);
    if (wait_for("JobDispatched", job, "control", 1, 500)) return true;
  }
  return false;
}

/* A worker that missed heartbeats goes down and its jobs leave lt_sched; back before their leases
 * ran out, it came up with every slot free, and a queued job took the slot a job still runs in.
 * Now the jobs still running there are booked on it again before any decision of that step. */
Test(scheduler, a_worker_back_from_missed_heartbeats_keeps_the_slots_its_jobs_run_in) {
  put_tenant("acme", 0);
  heartbeat_of("w0", 1, NULL, NULL, true); /* draining, never up: w1 is not the first worker folded */
  heartbeat("w1", 1);
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50,
                           .worker_timeout_ms = 1500};
  lt_scheduler_t *s = start(NULL, &c);
  submit("job-on", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(beating_until_dispatched("w1", "job-on"), "job-on was not dispatched: %s", dispatch_log("control"));
  control_rec("AttemptStarted", "job-on", "acme", 1);
  settle(3000); /* no heartbeat: w1 is down, job-on's lease (60 s) runs on */
  submit("job-next", "acme", LT_CLASS_STANDARD, NULL);
  settle(1000);
  beating("w1", 6); /* back, and heartbeating */
  cr_assert_eq(count_seen("JobDispatched", "job-next", "control"), 0,
               "the slot job-on runs in was given to another job: %s", dispatch_log("control"));
  cr_assert_eq(count_seen("AttemptStopped", "job-on", "control"), 0, "job-on was declared lost within its lease");
  control_rec("JobCompleted", "job-on", "acme", 1);
  cr_assert(beating_until_dispatched("w1", "job-next"), "the slot freed was not given: %s", dispatch_log("control"));
  lt_scheduler_destroy(s);
}

/* The same when the worker is away as a term starts: the new leader cannot book the job there
 * (its worker is not up), and when the worker comes back the job must be booked before a queued
 * one takes its slot. */
Test(scheduler, a_job_whose_worker_was_away_when_the_term_began_keeps_its_slot_when_it_returns) {
  put_tenant("acme", 0);
  heartbeat_of("w0", 1, NULL, NULL, true); /* draining, never up: w1 is not the first worker folded */
  heartbeat("w1", 1);
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50,
                           .worker_timeout_ms = 1500};
  lt_scheduler_t *s = start(NULL, &c);
  submit("job-on", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(beating_until_dispatched("w1", "job-on"), "job-on was not dispatched: %s", dispatch_log("control"));
  control_rec("AttemptStarted", "job-on", "acme", 1);
  settle(500);
  lt_scheduler_destroy(s);
  lt_test_msleep(2000); /* w1 silent past its timeout */
  s = start(NULL, &c);  /* a new term, with w1 away */
  submit("job-next", "acme", LT_CLASS_STANDARD, NULL);
  settle(1000);
  beating("w1", 6);
  cr_assert_eq(count_seen("JobDispatched", "job-next", "control"), 0,
               "the slot job-on runs in was given to another job: %s", dispatch_log("control"));
  lt_scheduler_destroy(s);
}

/* The policy's tables are sized when a term starts. Tenants that come after, past their size,
 * were refused one by one ("tenant table full", ignored) and their jobs stayed queued for good,
 * never dispatched, never failed; the workers' table the same way. Now a term that meets more
 * than fit ends, and the next one sizes them for what the log holds. */
Test(scheduler, tenants_past_the_policys_table_size_end_the_term_and_their_jobs_run) {
  put_tenant("t-1", 0);
  put_tenant("t-2", 0);
  heartbeat("w1", 8);
  lt_sched_config_t pol;
  lt_sched_config_default(&pol);
  pol.max_tenants = 2;
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50,
                           .policy = &pol};
  lt_scheduler_t *s = start(NULL, &c);
  char tenant[6][16], job[6][16];
  for (int i = 0; i < 6; i++) {
    snprintf(tenant[i], sizeof tenant[i], "t-%d", i + 1);
    snprintf(job[i], sizeof job[i], "job-t%d", i + 1);
    if (i >= 2) put_tenant(tenant[i], 0);
    submit(job[i], tenant[i], LT_CLASS_STANDARD, NULL);
  }
  for (int i = 0; i < 6; i++)
    cr_assert(wait_for("JobDispatched", job[i], "control", 1, 30000), "%s of a tenant past the table was never dispatched: %s",
              job[i], dispatch_log("control"));
  lt_scheduler_destroy(s);
}

/* A worker that heartbeats but does not start what it is given (cut from the broker its dispatch
 * partition leads on: chaos seed 6104 redispatched one job to it 20 times) gets no new work for a
 * while: the redispatch goes to another worker. */
Test(scheduler, a_worker_that_does_not_start_its_dispatch_gets_no_redispatch) {
  put_tenant("acme", 0);
  heartbeat("w1", 1);
  heartbeat("w2", 1);
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50,
                           .start_timeout_ms = 1500};
  lt_scheduler_t *s = start(NULL, &c);
  submit("job-deaf", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobDispatched", "job-deaf", "control", 1, 20000));
  const char *first = json_string_value(json_object_get(find_seen("JobDispatched", "job-deaf", "control", 0), "worker_id"));
  cr_assert_not_null(first);
  char deaf[16];
  snprintf(deaf, sizeof deaf, "%s", first);
  for (int i = 0; i < 20; i++) { /* both stay alive: heartbeats go on */
    heartbeat("w1", 1);
    heartbeat("w2", 1);
    if (wait_for("JobDispatched", "job-deaf", "control", 2, 500)) break;
  }
  json_t *second = find_seen("JobDispatched", "job-deaf", "control", 1);
  cr_assert_not_null(second, "not dispatched again");
  cr_assert_eq(json_integer_value(json_object_get(second, "attempt")), 2);
  cr_assert_str_neq(json_string_value(json_object_get(second, "worker_id")), deaf,
                    "the redispatch went back to the worker that did not start it");
  lt_scheduler_destroy(s);
}

/* A worker whose heartbeat says it drains (lt_worker_drain) gets no new job while it stays up:
 * the jobs go to the other worker, and one more than it holds waits. */
/* Five workers in a group whose dispatch topics have four partitions: the range assignor leaves
 * the fifth none, and a dispatch to it landed on another worker's partition, which dropped it
 * (the job lost a minute, the worker was cordoned for missing it). A worker that owns none while
 * others own some takes no work; once it owns one, it does. */
Test(scheduler, a_worker_that_owns_no_dispatch_partition_gets_no_job_until_it_owns_one) {
  put_tenant("acme", 0);
  heartbeat_owning("w-owns", 1, 0, 3);
  heartbeat_owning("w-none", 1, 0, 0);
  lt_scheduler_t *s = start(NULL, NULL);
  submit("job-a", "acme", LT_CLASS_STANDARD, NULL);
  submit("job-b", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobDispatched", NULL, "control", 1, 20000), "nothing dispatched");
  settle(1500);
  cr_assert_eq(count_seen("JobDispatched", NULL, "control"), 1, "a job went to the worker with no partition: %s",
               dispatch_log("control"));
  json_t *d = find_seen("JobDispatched", NULL, "control", 0);
  cr_assert_str_eq(json_string_value(json_object_get(d, "worker_id")), "w-owns");
  heartbeat_owning("w-none", 1, 1, 1); /* a partition of production's topic only: a standard job would be lost */
  settle(1500);
  cr_assert_eq(count_seen("JobDispatched", NULL, "control"), 1, "a standard job went to a worker with no standard "
               "partition: %s", dispatch_log("control"));
  heartbeat_owning("w-none", 1, 1, 3); /* a rebalance gave it one of each */
  cr_assert(wait_for("JobDispatched", NULL, "control", 2, 20000), "the worker that now owns a partition got no job: %s",
            dispatch_log("control"));
  d = find_seen("JobDispatched", NULL, "control", 1);
  cr_assert_str_eq(json_string_value(json_object_get(d, "worker_id")), "w-none");
  cr_assert_eq(count_seen("JobDispatched", NULL, "dispatch.standard"), 2);
  lt_scheduler_destroy(s);
}

Test(scheduler, a_draining_worker_gets_no_new_job) {
  put_tenant("acme", 0);
  heartbeat("w1", 2);
  heartbeat("w2", 2);
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50};
  lt_scheduler_t *s = start(NULL, &c);
  settle(1000); /* both up */
  heartbeat_of("w1", 2, NULL, NULL, true);
  settle(1000);
  const char *jobs[] = {"job-d1", "job-d2", "job-d3"};
  for (int i = 0; i < 3; i++) submit(jobs[i], "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobDispatched", "job-d1", "control", 1, 20000));
  cr_assert(wait_for("JobDispatched", "job-d2", "control", 1, 20000));
  for (int i = 0; i < 10; i++) { /* both stay alive; w1 still draining */
    heartbeat_of("w1", 2, NULL, NULL, true);
    heartbeat("w2", 2);
    settle(300);
  }
  for (int i = 0; i < 3; i++) {
    json_t *d = find_seen("JobDispatched", jobs[i], "control", 0);
    if (i == 2) {
      cr_assert_null(d, "a third job was placed: on the draining worker");
      continue;
    }
    cr_assert_str_eq(json_string_value(json_object_get(d, "worker_id")), "w2", "%s", jobs[i]);
  }
  heartbeat("w1", 2); /* the drain over (a new process with the same id) */
  cr_assert(wait_for("JobDispatched", "job-d3", "control", 1, 20000), "not placed once w1 took work again");
  cr_assert_str_eq(json_string_value(json_object_get(find_seen("JobDispatched", "job-d3", "control", 0), "worker_id")),
                   "w1");
  lt_scheduler_destroy(s);
}

static void two_gpus(lt_jobspec_t *s) { s->gpus = 2; }

/* Two 1-slot workers in one node group, a scheduler, and "job-gang" (2 GPUs) dispatched across
 * them: the leader, and its JobDispatched on lathe.control into *dispatch. */
static lt_scheduler_t *start_with_a_gang_of_two(json_t **dispatch) {
  put_tenant("acme", 0);
  heartbeat_of("w1", 1, "rack", "127.0.0.1:7001", false);
  heartbeat_of("w2", 1, "rack", "127.0.0.1:7002", false);
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50};
  lt_scheduler_t *s = start(NULL, &c);
  submit("job-gang", "acme", LT_CLASS_STANDARD, two_gpus);
  cr_assert(wait_for("JobDispatched", "job-gang", "control", 1, 20000));
  *dispatch = find_seen("JobDispatched", "job-gang", "control", 0);
  cr_assert_eq(json_array_size(json_object_get(*dispatch, "gang_workers")), 2, "not a gang of two workers");
  return s;
}

/* A gang across two workers one of which drains: the draining worker stops only what it speaks
 * for, so the scheduler asks rank 0 (wherever it is) to checkpoint and stop the gang. */
Test(scheduler, a_gang_with_a_part_on_a_draining_worker_is_asked_to_stop) {
  json_t *d;
  lt_scheduler_t *s = start_with_a_gang_of_two(&d);
  json_t *ranks = json_object_get(d, "gang_workers");
  const char *rank1 = json_string_value(json_array_get(ranks, 1));
  control_rec("AttemptStarted", "job-gang", "acme", 1);
  settle(1000);
  cr_assert_eq(count_seen("PreemptRequested", "job-gang", "control"), 0, "asked to stop before any drain");
  heartbeat_of(rank1, 1, "rack", strcmp(rank1, "w1") ? "127.0.0.1:7002" : "127.0.0.1:7001", true);
  cr_assert(wait_for("PreemptRequested", "job-gang", "control", 1, 20000), "the gang was not asked to stop");
  json_t *p = find_seen("PreemptRequested", "job-gang", "control", 0);
  cr_assert(strstr(json_string_value(json_object_get(p, "reason")), "drains"), "%s",
            json_string_value(json_object_get(p, "reason")));
  settle(1000);
  cr_assert_eq(count_seen("PreemptRequested", "job-gang", "control"), 1, "asked more than once");
  lt_scheduler_destroy(s);
}

/* A new leader books a running multi-worker gang on every worker it runs on (the previous one
 * left it out of the policy, so its slots looked free): a job submitted while none led waits
 * for them, a drain of its rank 1 still stops it, and its end frees them. */
Test(scheduler, a_new_leader_books_a_running_gang_on_every_worker_of_it) {
  json_t *d;
  lt_scheduler_t *s = start_with_a_gang_of_two(&d);
  json_t *ranks = json_object_get(d, "gang_workers");
  json_t *masks = json_object_get(d, "gang_gpu_masks");
  cr_assert(json_array_size(masks) == 2 && json_integer_value(json_array_get(masks, 0)) == 1 &&
                json_integer_value(json_array_get(masks, 1)) == 1,
            "each rank's GPUs are not in the dispatch (GPU 0 of each 1-slot worker)");
  char rank1[16];
  snprintf(rank1, sizeof rank1, "%s", json_string_value(json_array_get(ranks, 1)));
  control_rec("AttemptStarted", "job-gang", "acme", 1);
  settle(500);
  lt_scheduler_destroy(s); /* the leader dies while the gang runs */
  submit("job-one", "acme", LT_CLASS_STANDARD, NULL);
  s = start(NULL, NULL); /* the same settings */
  settle(2000);
  cr_assert_eq(count_seen("JobDispatched", "job-one", "control"), 0, "job-one was dispatched onto the gang's slots");
  const char *rank0 = strcmp(rank1, "w1") ? "w1" : "w2";
  heartbeat_of(rank1, 1, "rack", strcmp(rank1, "w1") ? "127.0.0.1:7002" : "127.0.0.1:7001", true);
  cr_assert(wait_for("PreemptRequested", "job-gang", "control", 1, 20000),
            "a drain of the gang's rank 1 did not stop it under the new leader");
  settle(500);
  cr_assert_eq(count_seen("JobDispatched", "job-one", "control"), 0, "job-one took a slot the gang still holds");
  control_rec("JobCompleted", "job-gang", "acme", 1);
  cr_assert(wait_for("JobDispatched", "job-one", "control", 1, 20000), "the gang's end did not free its slots");
  const char *went = json_string_value(json_object_get(find_seen("JobDispatched", "job-one", "control", 0), "worker_id"));
  cr_assert_str_eq(went, rank0, "job-one went to %s, the draining worker", went);
  lt_scheduler_destroy(s);
}

Test(scheduler, a_started_attempt_whose_lease_expires_is_stopped_lost_then_requeued) {
  put_tenant("acme", 0);
  heartbeat("w1", 1);
  lt_scheduler_conf_t c = {.producer_id = "scheduler/test", .lease_ms = 1000, .lease_margin_ms = 500,
                           .worker_timeout_ms = 60000, .tenant_grace_ms = 1000, .tick_ms = 50};
  lt_scheduler_t *s = start(NULL, &c);
  submit("job-lease", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobDispatched", "job-lease", "control", 1, 20000));
  int64_t t0 = lt_time_wall_ms();
  control_rec("AttemptStarted", "job-lease", "acme", 1);
  cr_assert(wait_for("AttemptStopped", "job-lease", "control", 1, 20000), "no AttemptStopped(lost)");
  json_t *st = find_seen("AttemptStopped", "job-lease", "control", 0);
  cr_assert_str_eq(json_string_value(json_object_get(st, "reason")), "lost");
  cr_assert_geq(json_integer_value(json_object_get(st, "occurred_at")) - t0, 1500 - 200,
                "fenced before expiry plus margin");
  cr_assert(wait_for("JobDispatched", "job-lease", "control", 2, 20000), "not dispatched again after the loss");
  cr_assert_eq(json_integer_value(json_object_get(find_seen("JobDispatched", "job-lease", "control", 1), "attempt")), 2);
  lt_scheduler_destroy(s);
}

Test(scheduler, cancel_of_a_queued_job_is_cancelled_at_once) {
  put_tenant("acme", 0);
  lt_scheduler_t *s = start(NULL, NULL);
  submit("job-cancel", "acme", LT_CLASS_STANDARD, NULL);
  cr_assert(wait_for("JobAccepted", "job-cancel", "control", 1, 20000));
  control_rec("CancelRequested", "job-cancel", "acme", 0);
  cr_assert(wait_for("JobCancelled", "job-cancel", "control", 1, 20000), "no JobCancelled");
  heartbeat("w1", 2); /* a worker now: the cancelled job is never dispatched */
  settle(1000);
  cr_assert_eq(count_seen("JobDispatched", "job-cancel", NULL), 0);
  const lt_job_t *j = lt_job_get(lt_proj_jobs(lt_scheduler_proj(s)), "job-cancel");
  cr_assert(j);
  cr_assert_eq(j->state, LT_JOB_CANCELLED);
  lt_scheduler_destroy(s);
}

/* ---------------------------------------------------------------- fairness (invariant 9) */

/* Every job of ids is QUEUED in the scheduler's own fold. The scheduler enqueues a job into its
 * policy in the same event callback that folds its JobAccepted, so once this holds, the next
 * decision sees all of them at once. */
typedef struct {
  lt_scheduler_t *s;
  char (*ids)[32];
  int n;
} queued_t;

static bool all_queued(void *ctx) {
  queued_t *q = ctx;
  lt_proj_t *f = lt_scheduler_proj(q->s);
  if (!f) return false;
  for (int i = 0; i < q->n; i++) {
    const lt_job_t *j = lt_job_get(lt_proj_jobs(f), q->ids[i]);
    if (!j || j->state != LT_JOB_QUEUED) return false;
  }
  return true;
}

/* JobDispatched records of tenant read back on topic_base. */
static int dispatched_to(const char *tenant, const char *topic_base) {
  int n = 0;
  size_t i;
  json_t *r;
  json_array_foreach(lt_test_tail_records(tail), i, r) {
    const char *t = lt_test_rs(r, "tenant_id");
    n += seen_is(r, "JobDispatched", NULL, topic_base) && t && strcmp(t, tenant) == 0;
  }
  return n;
}

/* "job@worker ..." of the JobDispatched records read back on topic_base, for failure messages.
 * Read order across partitions, not necessarily the order decided. */
static const char *dispatch_log(const char *topic_base) {
  static char out[4096];
  size_t len = 0;
  out[0] = '\0';
  json_t *r;
  for (int k = 0; (r = find_seen("JobDispatched", NULL, topic_base, k)) != NULL; k++) {
    int w = snprintf(out + len, sizeof out - len, "%s%s@%s", k ? " " : "",
                     json_string_value(json_object_get(r, "job_id")),
                     json_string_value(json_object_get(r, "worker_id")));
    if (w < 0 || (size_t)w >= sizeof out - len) break;
    len += (size_t)w;
  }
  return len ? out : "(none)";
}

typedef struct {
  const char *tenant;
  double weight;
  int expect; /* slots it must get: weighted max-min fair share of the slots offered */
} share_t;

/* The tenants submit jobs_each standard jobs each, in the order listed (all of the first one's
 * before any of the second's, so FIFO would give the first tenant every slot), and all are
 * queued while no worker exists. Then one worker offers `slots` slots: the first decision fills
 * them, and each tenant's count must be exactly its weighted max-min fair share. Jobs ask for
 * no device memory, so DRF's dominant share is the slot share. */
static void expect_weighted_split(const share_t *t, int nt, int jobs_each, int slots) {
  char ids[64][32];
  int n = 0;
  cr_assert_leq(nt * jobs_each, 64);
  for (int k = 0; k < nt; k++) put_tenant_weighted(t[k].tenant, t[k].weight, 0);
  lt_scheduler_t *s = start(NULL, NULL);
  for (int k = 0; k < nt; k++)
    for (int i = 0; i < jobs_each; i++, n++) {
      snprintf(ids[n], sizeof ids[n], "%s-%02d", t[k].tenant, i);
      submit(ids[n], t[k].tenant, LT_CLASS_STANDARD, NULL);
    }
  queued_t q = {s, ids, n};
  cr_assert(run_until(all_queued, &q, 30000), "not every job was queued within 30 s: %d JobAccepted, %d JobRejected of %d",
            count_seen("JobAccepted", NULL, "control"), count_seen("JobRejected", NULL, "control"), n);
  cr_assert_eq(count_seen("JobDispatched", NULL, NULL), 0, "dispatched with no worker: %s", dispatch_log("control"));
  heartbeat("w1", slots);
  cr_assert(wait_for("JobDispatched", NULL, "control", slots, 20000), "%d dispatches of %d slots offered within 20 s: %s",
            count_seen("JobDispatched", NULL, "control"), slots, dispatch_log("control"));
  settle(1500); /* the worker is full: nothing more may start */
  char got[512];
  size_t len = 0;
  for (int k = 0; k < nt; k++)
    len += (size_t)snprintf(got + len, sizeof got - len, "%s%s (weight %g): %d, fair share %d", k ? "; " : "",
                            t[k].tenant, t[k].weight, dispatched_to(t[k].tenant, "control"), t[k].expect);
  cr_assert_eq(count_seen("JobDispatched", NULL, "control"), slots, "more dispatches than slots: %s | %s", got,
               dispatch_log("control"));
  cr_assert_eq(count_seen("JobDispatched", NULL, "dispatch.standard"), slots, "dispatch.standard: %s",
               dispatch_log("dispatch.standard"));
  for (int k = 0; k < nt; k++)
    cr_assert_eq(dispatched_to(t[k].tenant, "control"), t[k].expect, "split of %d slots: %s | dispatched: %s", slots,
                 got, dispatch_log("control"));
  lt_scheduler_destroy(s);
}

static void eight_gpus(lt_jobspec_t *s) { s->gpus = 8; }

/* A production job that needs the whole worker preempts every preemptible job on it, one of them
 * dispatched and not yet started: lt_sched counts that one preempting from then on and never asks
 * again, so its PreemptRequested must come when it starts, or the production job waits for it
 * to end by itself. */
Test(scheduler, a_job_preempted_before_it_started_is_asked_to_stop_when_it_starts) {
  put_tenant("acme", 0);
  heartbeat("w1", 8);
  lt_scheduler_t *s = start(NULL, NULL);
  char pre[8][32];
  for (int i = 0; i < 8; i++) {
    snprintf(pre[i], sizeof pre[i], "pre-%02d", i);
    submit(pre[i], "acme", LT_CLASS_PREEMPTIBLE, NULL);
  }
  cr_assert(wait_for("JobDispatched", NULL, "control", 8, 20000), "the preemptible jobs did not fill w1: %s",
            dispatch_log("control"));
  const char *late = NULL;
  for (int i = 0; i < 8; i++) {
    json_t *d = find_seen("JobDispatched", NULL, "control", i);
    const char *job = json_string_value(json_object_get(d, "job_id"));
    if (i < 7) control_rec("AttemptStarted", job, "acme", 1);
    else late = job;
  }
  settle(1000);
  submit("prod-whole", "acme", LT_CLASS_PRODUCTION, eight_gpus);
  cr_assert(wait_for("PreemptRequested", NULL, "control", 7, 20000), "the started jobs were not asked to stop");
  settle(1500);
  cr_assert_eq(count_seen("PreemptRequested", late, "control"), 0, "asked to stop before it started");
  control_rec("AttemptStarted", late, "acme", 1);
  cr_assert(wait_for("PreemptRequested", late, "control", 1, 20000),
            "%s, preempted before it started, was never asked to stop once it ran", late);
  json_t *p = find_seen("PreemptRequested", late, "control", 0);
  cr_assert_eq(json_integer_value(json_object_get(p, "attempt")), 1);
  lt_scheduler_destroy(s);
}

/* Weights 3:1 over 8 slots: keys n/(8*w) meet at 6/24 with 6 and 2 slots, whatever the tie
 * order. FIFO gives 8:0 (heavy submitted first), equal shares 4:4. */
Test(scheduler, weighted_fair_share_gives_3_to_1_tenants_6_and_2_of_8_slots) {
  share_t t[] = {{"heavy", 3, 6}, {"light", 1, 2}};
  expect_weighted_split(t, 2, 12, 8);
}

/* Weights 1:2:3 over 6 slots: 1, 2 and 3 slots (all keys 1/6). The lightest submits first, so
 * FIFO gives 6:0:0; equal shares 2:2:2. */
Test(scheduler, weighted_fair_share_gives_1_2_3_tenants_1_2_and_3_of_6_slots) {
  share_t t[] = {{"one", 1, 1}, {"two", 2, 2}, {"three", 3, 3}};
  expect_weighted_split(t, 3, 10, 6);
}

/* Strict priority: standard work fills the only worker and more of it waits; a production job
 * of the same tenant, submitted after all of it, takes the next slot — first one freed by a
 * completion, then one a new worker's heartbeat offers. FIFO would start a waiting standard
 * job; cross-class DRF would not favour a tenant already holding slots. */
Test(scheduler, a_later_production_job_takes_the_next_free_slot_before_waiting_standard_jobs) {
  put_tenant("acme", 0);
  heartbeat("w1", 2);
  lt_scheduler_t *s = start(NULL, NULL);
  char std[6][32];
  for (int i = 0; i < 6; i++) {
    snprintf(std[i], sizeof std[i], "std-%02d", i);
    submit(std[i], "acme", LT_CLASS_STANDARD, NULL);
  }
  cr_assert(wait_for("JobAccepted", NULL, "control", 6, 20000), "the standard jobs were not accepted");
  cr_assert(wait_for("JobDispatched", NULL, "control", 2, 20000), "the standard jobs did not fill w1: %s",
            dispatch_log("control"));
  settle(500);
  cr_assert_eq(count_seen("JobDispatched", NULL, "dispatch.standard"), 2, "w1 has 2 slots: %s", dispatch_log("control"));

  /* a freed slot */
  char pj[2][32] = {"prod-00", "prod-01"};
  submit(pj[0], "acme", LT_CLASS_PRODUCTION, NULL);
  queued_t q = {s, pj, 1};
  cr_assert(run_until(all_queued, &q, 20000), "prod-00 was not queued");
  settle(500);
  cr_assert_eq(count_seen("JobDispatched", pj[0], NULL), 0, "prod-00 dispatched with no free slot: %s",
               dispatch_log("control"));
  const char *done = json_string_value(json_object_get(find_seen("JobDispatched", NULL, "control", 0), "job_id"));
  control_rec("AttemptStarted", done, "acme", 1);
  control_rec("JobCompleted", done, "acme", 1);
  cr_assert(wait_for("JobDispatched", pj[0], "dispatch.production", 1, 20000),
            "prod-00 did not get the slot %s freed: %s", done, dispatch_log("control"));
  settle(1500);
  cr_assert_eq(count_seen("JobDispatched", NULL, "dispatch.standard"), 2,
               "a waiting standard job took a slot while production waited: %s", dispatch_log("control"));
  cr_assert_str_eq(json_string_value(json_object_get(find_seen("JobDispatched", pj[0], "control", 0), "worker_id")),
                   "w1");

  /* a slot a heartbeat offers */
  submit(pj[1], "acme", LT_CLASS_PRODUCTION, NULL);
  q = (queued_t){s, pj + 1, 1};
  cr_assert(run_until(all_queued, &q, 20000), "prod-01 was not queued");
  settle(500);
  cr_assert_eq(count_seen("JobDispatched", pj[1], NULL), 0, "prod-01 dispatched with no free slot: %s",
               dispatch_log("control"));
  heartbeat("w2", 1);
  cr_assert(wait_for("JobDispatched", pj[1], "dispatch.production", 1, 20000),
            "prod-01 did not get w2's slot: %s", dispatch_log("control"));
  settle(1500);
  cr_assert_str_eq(json_string_value(json_object_get(find_seen("JobDispatched", pj[1], "control", 0), "worker_id")),
                   "w2");
  cr_assert_eq(count_seen("JobDispatched", NULL, "dispatch.standard"), 2,
               "a waiting standard job took a slot while production waited: %s", dispatch_log("control"));
  cr_assert_eq(count_seen("JobDispatched", NULL, "control"), 4, "%s", dispatch_log("control"));
  lt_scheduler_destroy(s);
}

/* A consumer whose offset is reset rereads a partition from its start (after a broker restart); the
 * projection folds nothing of it twice: same state, same digest, every reread message counted
 * (chaos seeds 8010 and 8015: an API that folded a partition again had another digest). */
/* Retention emptied a partition the scheduler folds (its oldest offset is its end, > 0): it gives
 * the fold no position, and the scheduler used to wait for one until a quiet second, which a
 * fleet's heartbeats never leave. A new scheduler leads all the same while heartbeats come every
 * 300 ms, and decides what comes after. */
static bool leading_under_heartbeats(void *ctx) {
  static int64_t last;
  if (lt_time_mono_ms() - last >= 300) {
    heartbeat("w-busy", 1);
    last = lt_time_mono_ms();
  }
  return is_leading(ctx);
}

Test(scheduler, a_partition_retention_emptied_does_not_keep_a_new_leader_catching_up) {
  put_tenant("acme", 0);
  lt_scheduler_t *s1 = start("g", NULL);
  submit("job-old", "acme", LT_CLASS_PREEMPTIBLE, NULL);
  cr_assert(wait_for("JobAccepted", "job-old", "control", 1, 20000), "the first job was never accepted");
  lt_scheduler_destroy(s1);
  char jobs[256];
  lt_bus_topic_name(conf, "jobs", jobs, sizeof jobs);
  lt_test_empty_partition(conf, jobs, (int32_t)LT_CLASS_PREEMPTIBLE * 2);
  char g[200];
  snprintf(g, sizeof g, "%sg", prefix);
  lt_scheduler_conf_t c = {.bus = conf, .registry = reg, .producer_id = "scheduler/test", .lease_ms = 60000,
                           .tenant_grace_ms = 1000, .tick_ms = 50, .group_id = g};
  lt_scheduler_t *s2;
  cr_assert_eq(lt_scheduler_new(base, &c, &s2, err, sizeof err), LT_OK, "%s", err);
  cr_assert(run_until(leading_under_heartbeats, s2, 30000),
            "the new scheduler kept catching up for 30 s behind a partition that holds nothing");
  submit("job-new", "acme", LT_CLASS_STANDARD, NULL);
  cr_expect(wait_for("JobAccepted", "job-new", "control", 1, 20000), "a job after the takeover was not accepted");
  lt_scheduler_destroy(s2);
  /* `lathe admin replay --from-offset N`: below the emptied partition's oldest offset it starts there
   * and says so (before, the consumer's reset replayed from the oldest record without a word), and
   * past every partition's end it reads nothing (before: everything, from the oldest record). */
  char cmd[1024];
  int rc;
  snprintf(cmd, sizeof cmd, "LATHE_TOPIC_PREFIX='%s' timeout 60 '%s' admin replay --json --from-offset 0 2>&1", prefix,
           lt_test_lathe_bin());
  char *out = lt_test_run(cmd, &rc), want[300];
  snprintf(want, sizeof want, "%s [%d] keeps records from offset 1 only", jobs, (int)LT_CLASS_PREEMPTIBLE * 2);
  cr_expect(rc == 0 && strstr(out, want) && strstr(out, "\"jobs\":1"), "exit %d: %s", rc, out);
  free(out);
  snprintf(cmd, sizeof cmd, "LATHE_TOPIC_PREFIX='%s' timeout 60 '%s' admin replay --json --from-offset 1000000 2>&1",
           prefix, lt_test_lathe_bin());
  out = lt_test_run(cmd, &rc);
  cr_expect(rc == 0 && strstr(out, "\"records\":0,") && !strstr(out, "keeps records"), "exit %d: %s", rc, out);
  free(out);
}

Test(scheduler, a_partition_read_again_folds_nothing_twice) {
  put_tenant("acme", 0);
  submit("job-again", "acme", LT_CLASS_STANDARD, NULL);
  control_rec("JobAccepted", "job-again", "acme", 0);
  control_rec("JobDispatched", "job-again", "acme", 1);
  control_rec("AttemptStarted", "job-again", "acme", 1);
  char topics[2][256];
  lt_bus_topic_name(conf, "jobs", topics[0], sizeof topics[0]);
  lt_bus_topic_name(conf, "control", topics[1], sizeof topics[1]);
  lt_proj_t *p;
  cr_assert_eq(lt_proj_new(reg, &p, err, sizeof err), LT_OK, "%s", err);
  lt_bus_consumer_t *c;
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &c, err, sizeof err), LT_OK, "%s", err);
  lt_bus_tp_t parts[64];
  size_t np = 0;
  for (int t = 0; t < 2; t++) {
    int n = 0;
    lt_bus_admin_t *a;
    cr_assert_eq(lt_bus_admin_new(conf, &a, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(lt_bus_admin_describe_topic(a, topics[t], 10000, &n, err, sizeof err), LT_OK, "%s", err);
    lt_bus_admin_destroy(a);
    for (int i = 0; i < n && np < 64; i++) parts[np++] = (lt_bus_tp_t){topics[t], i, LT_BUS_OFFSET_BEGINNING};
  }
  cr_assert_eq(lt_bus_consumer_assign(c, parts, np, err, sizeof err), LT_OK, "%s", err);
  int folded = 0;
  for (int64_t t0 = lt_time_mono_ms(); folded < 4 && lt_time_mono_ms() - t0 < 20000;) {
    const lt_bus_msg_t *m;
    cr_assert_eq(lt_bus_consumer_poll(c, 200, &m, err, sizeof err), LT_OK, "%s", err);
    if (m && lt_proj_fold_msg(p, m, NULL, NULL, NULL, err, sizeof err) == LT_OK) folded++;
  }
  const lt_job_t *j = lt_job_get(lt_proj_jobs(p), "job-again");
  cr_assert(j && j->state == LT_JOB_RUNNING, "the job is not running in the projection");
  uint64_t records = j->records;
  char before[65], after[65];
  cr_assert_eq(lt_job_digest(lt_proj_jobs(p), before), LT_OK);
  /* every partition again from its start, as after an offset reset */
  for (size_t i = 0; i < np; i++)
    cr_assert_eq(lt_bus_consumer_seek(c, parts[i].topic, parts[i].partition, LT_BUS_OFFSET_BEGINNING, 5000, err,
                                      sizeof err), LT_OK, "%s", err);
  for (int64_t t0 = lt_time_mono_ms(); lt_proj_redelivered(p) < 4 && lt_time_mono_ms() - t0 < 20000;) {
    const lt_bus_msg_t *m;
    cr_assert_eq(lt_bus_consumer_poll(c, 200, &m, err, sizeof err), LT_OK, "%s", err);
    if (m) cr_assert_eq(lt_proj_fold_msg(p, m, NULL, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  }
  cr_assert_eq(lt_proj_redelivered(p), 4, "%llu messages skipped as read before, want 4",
               (unsigned long long)lt_proj_redelivered(p));
  j = lt_job_get(lt_proj_jobs(p), "job-again");
  cr_assert_eq(j->records, records, "records applied again: %llu, were %llu", (unsigned long long)j->records,
               (unsigned long long)records);
  cr_assert_eq(lt_job_digest(lt_proj_jobs(p), after), LT_OK);
  cr_assert_str_eq(after, before);
  lt_bus_consumer_destroy(c);
  lt_proj_destroy(p);
}

/* The job's messages (key job) on partition part of topic topic_base, from its start: folded into p
 * (when not NULL) as the consumer reads them; returns how many there were (want: stop after). */
static int fold_job_messages(lt_proj_t *p, const char *topic_base, const char *job, int32_t part, int want,
                             int64_t *offsets) {
  char topic[256];
  lt_bus_topic_name(conf, topic_base, topic, sizeof topic);
  lt_bus_consumer_t *c;
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &c, err, sizeof err), LT_OK, "%s", err);
  lt_bus_tp_t tp = {topic, part, LT_BUS_OFFSET_BEGINNING};
  cr_assert_eq(lt_bus_consumer_assign(c, &tp, 1, err, sizeof err), LT_OK, "%s", err);
  int seen = 0;
  for (int64_t t0 = lt_time_mono_ms(); seen < want && lt_time_mono_ms() - t0 < 20000;) {
    const lt_bus_msg_t *m;
    cr_assert_eq(lt_bus_consumer_poll(c, 200, &m, err, sizeof err), LT_OK, "%s", err);
    size_t kl = 0;
    const char *k = m ? lt_bus_msg_key(m, &kl) : NULL;
    if (!k || kl != strlen(job) || memcmp(k, job, kl) != 0) continue;
    if (offsets) offsets[seen] = lt_bus_msg_offset(m);
    if (p) cr_assert_eq(lt_proj_fold_msg(p, m, NULL, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
    seen++;
  }
  lt_bus_consumer_destroy(c);
  return seen;
}


/* An api folds its own JobSubmitted when the broker acknowledges it (read-your-writes), before its
 * consumer reads that far. The same job id submitted again elsewhere (an idempotency key retried
 * on another api while a broker restarted) can stand earlier in the log, and the scheduler may
 * already have accepted that one. The job is the log's first: when the consumer reads it the
 * projection takes its fields, and the job's records read before the early fold (kept aside, the
 * job unknown then) are applied at it; same state, fields and digest as a fold in log order (chaos
 * seeds 8507: an api kept its own record's submitted_at; 6514: an api's job stayed "submitted",
 * its control records aside for good). */
Test(scheduler, a_submission_folded_early_yields_to_an_earlier_one_in_the_log) {
  put_tenant("acme", 0);
  const int32_t part = LT_CLASS_STANDARD * 2;
  submit("job-twice", "acme", LT_CLASS_STANDARD, NULL);
  usleep(20 * 1000);
  lt_avro_record_t *second = job_submitted("test-upstream", "job-twice", "acme", LT_CLASS_STANDARD, 3600, two_gpus);
  const uint8_t *enc;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(second, &enc, &len, err, sizeof err), LT_OK, "%s", err);
  void *bytes = malloc(len);
  cr_assert_not_null(bytes);
  memcpy(bytes, enc, len);
  produce_rec("jobs", part, "job-twice", second);
  lt_avro_record_destroy(second);
  lt_avro_record_t *acc;
  cr_assert_eq(lt_avro_record_new(reg, "JobAccepted", &acc, err, sizeof err), LT_OK);
  lt_avro_record_stamp(acc, "test");
  lt_avro_set_string(acc, "job_id", "job-twice");
  lt_avro_set_string(acc, "tenant_id", "acme");
  produce_rec("control", 0, "job-twice", acc);
  lt_avro_record_destroy(acc);
  int64_t off[2];
  cr_assert_eq(fold_job_messages(NULL, "jobs", "job-twice", part, 2, off), 2, "both submissions in the log");
  lt_proj_t *live, *log;
  cr_assert_eq(lt_proj_new(reg, &live, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_proj_new(reg, &log, err, sizeof err), LT_OK, "%s", err);
  /* the api that wrote the second reads the acceptance first (kept aside: no such job yet), folds
   * its own submission at the acknowledgement, then reads the jobs partition */
  cr_assert_eq(fold_job_messages(live, "control", "job-twice", 0, 1, NULL), 1);
  cr_assert_null(lt_job_get(lt_proj_jobs(live), "job-twice"));
  cr_assert_eq(lt_proj_apply_early(live, bytes, len, part, off[1], NULL, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  const lt_job_t *a = lt_job_get(lt_proj_jobs(live), "job-twice");
  cr_assert(a && a->gpus == 2, "read-your-writes: the api's own record");
  cr_assert_eq(a->state, LT_JOB_QUEUED, "the acceptance kept aside was not applied at the early fold");
  fold_job_messages(live, "jobs", "job-twice", part, 2, NULL);
  fold_job_messages(log, "jobs", "job-twice", part, 2, NULL);
  fold_job_messages(log, "control", "job-twice", 0, 1, NULL);
  a = lt_job_get(lt_proj_jobs(live), "job-twice");
  const lt_job_t *b = lt_job_get(lt_proj_jobs(log), "job-twice");
  cr_assert(a && b);
  cr_assert_eq(b->gpus, 1, "the log's first submission asked for one GPU");
  cr_assert_eq(a->gpus, 1, "the api kept its own later submission (%d GPUs)", a->gpus);
  cr_assert_eq(a->submitted_at_ms, b->submitted_at_ms);
  cr_assert_eq(a->state, b->state);
  cr_assert_eq(a->records, b->records);
  cr_assert_eq(lt_proj_reseeded(live), 1);
  json_t *sa = lt_proj_job_info(live, "job-twice"), *sb = lt_proj_job_info(log, "job-twice");
  cr_assert(sa && sb && json_equal(json_object_get(sa, "spec"), json_object_get(sb, "spec")),
            "the job's spec is the first's");
  char da[65], db[65];
  cr_assert_eq(lt_job_digest(lt_proj_jobs(live), da), LT_OK);
  cr_assert_eq(lt_job_digest(lt_proj_jobs(log), db), LT_OK);
  cr_assert_str_eq(da, db);
  free(bytes);
  lt_proj_destroy(live);
  lt_proj_destroy(log);
}

/* A JobSubmitted of the same id naming another tenant, earlier in the log (a forged write: only
 * the api principal may write lathe.jobs), does not re-seed the job an api made from its own
 * tenant's submission: the api keeps its tenant's fields, and nothing counts as re-seeded. */
Test(scheduler, an_earlier_submission_of_another_tenant_does_not_reseed_a_job) {
  put_tenant("acme", 0);
  put_tenant("evil", 0);
  const int32_t part = LT_CLASS_STANDARD * 2;
  submit("job-forged", "evil", LT_CLASS_STANDARD, NULL);
  lt_avro_record_t *own = job_submitted("test-upstream", "job-forged", "acme", LT_CLASS_STANDARD, 3600, two_gpus);
  const uint8_t *enc;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(own, &enc, &len, err, sizeof err), LT_OK, "%s", err);
  void *bytes = malloc(len);
  cr_assert_not_null(bytes);
  memcpy(bytes, enc, len);
  produce_rec("jobs", part, "job-forged", own);
  lt_avro_record_destroy(own);
  int64_t off[2];
  cr_assert_eq(fold_job_messages(NULL, "jobs", "job-forged", part, 2, off), 2, "both submissions in the log");
  lt_proj_t *live;
  cr_assert_eq(lt_proj_new(reg, &live, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_proj_apply_early(live, bytes, len, part, off[1], NULL, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  fold_job_messages(live, "jobs", "job-forged", part, 2, NULL);
  const lt_job_t *j = lt_job_get(lt_proj_jobs(live), "job-forged");
  cr_assert(j != NULL);
  cr_assert_str_eq(j->tenant_id, "acme");
  cr_assert_eq(j->gpus, 2, "the other tenant's record re-seeded the job");
  cr_assert_eq(lt_proj_reseeded(live), 0);
  free(bytes);
  lt_proj_destroy(live);
}
