/* lt_worker_session against the real broker of ops/stack: which of a session's recorded calls a
 * resumed attempt hands its executor. The test writes SessionCall records the way the API does
 * (scratch topics, ops/topics.tsv), starts the worker's side of an attempt with an executor that
 * is a pipe, and reads the "call" lines it gets. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_job_record.h"
#include "lt_proto.h"
#include "lt_sealed.h"
#include "lt_store.h"
#include "lt_test.h"
#include "lt_time.h"
#include "lt_worker_session.h"

#define T_MS 20000

static char err[1024];
static lt_bus_conf_t *bus;
static lt_bus_admin_t *admin;
static lt_bus_producer_t *prod;
static lt_avro_registry_t *reg;
static lt_store_t *store;
static char prefix[96], t_calls[256], t_progress[256], t_control[256], dir[] = "/tmp/lt-wsess-XXXXXX";

static void setup(void) {
  bus = lt_test_bus_scratch("twss", prefix, sizeof prefix, &admin);
  lt_test_topics_create(bus, admin, T_MS);
  lt_bus_topic_name(bus, "calls", t_calls, sizeof t_calls);
  lt_bus_topic_name(bus, "progress", t_progress, sizeof t_progress);
  lt_bus_topic_name(bus, "control", t_control, sizeof t_control);
  cr_assert_eq(lt_bus_producer_new(bus, NULL, &prod, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  cr_assert_not_null(mkdtemp(dir));
  cr_assert_eq(lt_store_dir_new(&store, dir, err, sizeof err), LT_OK, "%s", err);
}

static void teardown(void) {
  lt_store_destroy(store);
  lt_test_rm_rf(dir);
  lt_avro_registry_destroy(reg);
  lt_bus_producer_destroy(prod, 5000);
  if (admin) lt_test_topics_delete(prefix);
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(bus);
}

TestSuite(wsess, .init = setup, .fini = teardown, .timeout = 120);

/* A SessionCall as the API records one, with call id cid and the object key of its body (NULL:
 * none); returns its sequence number (offset + 1). */
static int64_t record_call_body(const char *tenant, const char *job, const char *kind, const char *cid,
                                const char *object_key) {
  lt_avro_record_t *rec;
  const uint8_t *bytes;
  size_t len;
  cr_assert_eq(lt_avro_record_new(reg, "SessionCall", &rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_stamp(rec, "api/test"), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "job_id", job), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "tenant_id", tenant), LT_OK);
  cr_assert_eq(lt_avro_set_string(rec, "call_id", cid), LT_OK);
  cr_assert_eq(lt_avro_set_enum(rec, "kind", kind), LT_OK);
  cr_assert_eq(object_key ? lt_avro_set_string(rec, "object_key", object_key) : lt_avro_set_null(rec, "object_key"),
               LT_OK);
  cr_assert_eq(lt_avro_set_null(rec, "sha256"), LT_OK);
  cr_assert_eq(lt_avro_set_long(rec, "size_bytes", 0), LT_OK);
  cr_assert_eq(lt_avro_set_int(rec, "examples", 0), LT_OK);
  cr_assert_eq(lt_avro_record_encode(rec, &bytes, &len, err, sizeof err), LT_OK, "%s", err);
  lt_bus_record_t r = {.topic = t_calls, .partition = lt_calls_partition(job), .key = job, .key_size = strlen(job),
                       .value = bytes, .value_size = len};
  int64_t offset = -1;
  cr_assert_eq(lt_bus_produce_sync(prod, &r, T_MS, NULL, &offset, err, sizeof err), LT_OK, "%s", err);
  lt_avro_record_destroy(rec);
  return offset + 1;
}

/* Without a body. */
static int64_t record_call_id(const char *tenant, const char *job, const char *kind, const char *cid) {
  return record_call_body(tenant, job, kind, cid, NULL);
}

/* The same with a random call id, as a call sent without an Idempotency-Key. */
static int64_t record_call(const char *tenant, const char *job, const char *kind) {
  char cid[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  cr_assert_eq(lt_crypto_random_id(cid), LT_OK);
  return record_call_id(tenant, job, kind, cid);
}

/* The "call" lines the executor's pipe got within ms: "seq kind" each, space-separated. */
static void read_calls(int fd, int ms, char *out, size_t n) {
  char buf[8192];
  size_t got = 0;
  int64_t until = lt_time_mono_ms() + ms;
  for (int64_t now; (now = lt_time_mono_ms()) < until && got < sizeof buf - 1;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(until - now)) <= 0) break;
    ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  buf[got] = '\0';
  out[0] = '\0';
  for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
    lt_proto_msg_t m = {0};
    if (lt_proto_decode(line, &m, NULL, 0) == LT_OK && m.type == LT_PROTO_CALL)
      snprintf(out + strlen(out), n - strlen(out), "%s%lld %s", out[0] ? " " : "", (long long)m.call.seq,
               m.call.kind ? m.call.kind : "?");
    lt_proto_msg_release(&m);
  }
}

/* A fresh tenant and session id. */
static void fresh_ids(char tenant[40], char job[48]) {
  char rid[33];
  cr_assert_eq(lt_crypto_random_id(rid), LT_OK);
  snprintf(tenant, 40, "wt-%.12s", rid);
  snprintf(job, 48, "ses-%.24s", rid);
}

/* The worker's side of attempt 2 of job, resumed at resume_seq, its executor the pipe fds. */
static uint8_t key[LT_CRYPTO_KEY_BYTES]; /* the tenant's data key, as the worker is handed it */
static bool key_made;                     /* made before the attempt (bodies sealed under it) */

/* Attempt 2 resumes (resume_seq > 0) from a state attempt 1 saved. */
static lt_wsess_t *start_attempt(const char *tenant, const char *job, int64_t since, int64_t resume_seq,
                                 bool restarted, int fds[2]) {
  cr_assert_eq(pipe(fds), 0);
  if (!key_made) cr_assert_eq(lt_crypto_random(key, sizeof key), LT_OK);
  key_made = false;
  lt_wsess_conf_t c = {.bus = bus, .producer = prod, .store = store, .registry = reg, .producer_id = "worker/test",
                       .t_calls = t_calls, .t_progress = t_progress, .t_control = t_control, .tenant_id = tenant,
                       .job_id = job, .attempt = 2, .key = key, .key_id = "dek-1", .since_ms = since,
                       .resume_seq = resume_seq, .resume_attempt = resume_seq > 0 ? 1 : 0, .restarted = restarted,
                       .mem_dir = dir, .exec_fd = fds[1]};
  lt_wsess_t *s = NULL;
  cr_assert_eq(lt_wsess_start(&c, &s, err, sizeof err), LT_OK, "%s", err);
  lt_wsess_ready(s, 1);
  return s;
}

/* Within 8 s the executor gets one call line, seq and kind; then the attempt and its pipe end. */
static void expect_calls(lt_wsess_t *s, int fds[2], int64_t seq, const char *kind) {
  char calls[512], want[64];
  read_calls(fds[0], 8000, calls, sizeof calls);
  lt_wsess_destroy(s);
  close(fds[0]);
  close(fds[1]);
  snprintf(want, sizeof want, "%lld %s", (long long)seq, kind);
  cr_assert_str_eq(calls, want, "the executor got [%s], not [%s]", calls, want);
}

/* Chaos seed 6703: the lost attempt ran the session's end, its final checkpoint (the end's
 * sequence number) was committed, and the attempt died before the job's completion was recorded.
 * The next attempt resumes from that checkpoint: it skips the calls the state holds, but must run
 * the end again, or the session waits for calls for good. */
Test(wsess, a_resumed_attempt_runs_the_end_its_checkpoint_was_taken_for) {
  char tenant[40], job[48];
  fresh_ids(tenant, job);
  int64_t since = lt_time_wall_ms();
  int64_t s1 = record_call(tenant, job, "forward_backward");
  int64_t s2 = record_call(tenant, job, "optim_step");
  int64_t end = record_call(tenant, job, "end");
  cr_assert(s1 < s2 && s2 < end);
  int fds[2];
  lt_wsess_t *s = start_attempt(tenant, job, since, end, true, fds);
  expect_calls(s, fds, end, "end"); /* the end alone, not the calls its state holds */
}

/* A lost attempt committed the state a save_state call took, then died before it recorded the
 * call's answer: the call stayed pending for good, and load_state never found its name. The
 * attempt resumed from that state answers it as the attempt that saved it (the API keeps an
 * attempt's first answer of a call, so one recorded already stands), without running it; the
 * call's body goes as an answered call's does. */
Test(wsess, a_resumed_attempt_answers_the_save_its_state_was_taken_by) {
  char tenant[40], job[48], cid[LT_CALL_ID_MAX], okey[256];
  fresh_ids(tenant, job);
  int64_t since = lt_time_wall_ms();
  cr_assert_eq(lt_crypto_random(key, sizeof key), LT_OK);
  key_made = true;
  lt_crypto_dek_t *dek;
  cr_assert_eq(lt_crypto_dek_import(&dek, tenant, "dek-1", key, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_random_id(cid), LT_OK);
  snprintf(okey, sizeof okey, "sessions/%s/%s/calls/%s", tenant, job, cid);
  const char *body = "{\"kind\":\"save_state\",\"name\":\"before-crash\"}";
  cr_assert_eq(lt_sealed_put(store, dek, okey, body, strlen(body), NULL, err, sizeof err), LT_OK, "%s", err);
  record_call(tenant, job, "forward_backward");
  int64_t held = record_call_body(tenant, job, "save_state", cid, okey);
  int64_t after = record_call(tenant, job, "optim_step"); /* queued while the attempt was lost */
  int fds[2];
  lt_wsess_t *s = start_attempt(tenant, job, since, held, true, fds);
  char calls[512];
  read_calls(fds[0], 4000, calls, sizeof calls);
  cr_expect_str_eq(calls, "", "the executor got [%s]: nothing runs again", calls);
  lt_store_info_t info;
  lt_err_t e = LT_OK;
  lt_test_wait_until((e = lt_store_head(store, okey, &info, err, sizeof err)) == LT_ERR_NOT_FOUND, 10000, 50,
                     "the answered save's body is still there (%s)", lt_err_str(e));
  lt_wsess_destroy(s);
  close(fds[0]);
  close(fds[1]);
  lt_test_tail_t *t = lt_test_tail_open(bus, (const char *const[]){"progress", NULL});
  lt_test_tail_settle(t, 1500);
  json_t *done = lt_test_tail_select(t, "progress", "PrimitiveCompleted", job, 0), *save = NULL, *failed = NULL, *r;
  size_t i;
  json_array_foreach(done, i, r) {
    json_t *f = r; /* a tail record: lt_test_ri reads its fields */
    if (lt_test_ri(f, "seq") == held) {
      cr_expect_null(save, "the save is answered once");
      save = f;
    }
    if (lt_test_ri(f, "seq") == after) failed = f;
  }
  cr_assert_not_null(save, "the save its state was taken by is not answered");
  cr_expect_eq(lt_test_ri(save, "attempt"), 1, "answered as the attempt that saved the state");
  cr_expect_str_eq(lt_test_rs(save, "status"), "done");
  cr_expect_str_eq(lt_test_rs(save, "kind"), "save_state");
  cr_expect_str_eq(lt_test_rs(save, "checkpoint_name"), "before-crash");
  cr_expect_eq(lt_test_ri(save, "step"), 1, "the step the state holds");
  cr_assert_not_null(failed, "the call after the state is answered too");
  cr_expect_str_eq(lt_test_rs(failed, "error_code"), "session_restarted");
  cr_expect_eq(lt_test_ri(failed, "attempt"), 2);
  void *d = NULL;
  size_t dl = 0;
  cr_assert_eq(lt_sealed_get(store, dek, lt_test_rs(save, "result_key"), 4096, &d, &dl, err, sizeof err), LT_OK, "%s",
               err);
  json_t *res = json_loadb(d, dl, 0, NULL);
  cr_expect_str_eq(json_string_value(json_object_get(res, "name")), "before-crash");
  cr_expect_eq(json_integer_value(json_object_get(res, "checkpoint")), held, "the result names the state's checkpoint");
  json_decref(res);
  free(d);
  json_decref(done);
  lt_test_tail_close(t);
  lt_crypto_dek_destroy(dek);
}

/* Two records of one keyed call id (an Idempotency-Key retried through two API processes, or after a
 * delivery report that said "failed" for a record the broker kept): the first runs, the second
 * never, even when the first is one the resumed state holds; another tenant's record of the id
 * (forged) neither runs nor takes the id from the session's own. */
Test(wsess, a_keyed_call_recorded_twice_runs_once) {
  char tenant[40], job[48], k1[LT_CALL_ID_MAX], k2[LT_CALL_ID_MAX];
  fresh_ids(tenant, job);
  lt_call_id_for_key(tenant, job, "step-1", k1);
  lt_call_id_for_key(tenant, job, "save-1", k2);
  cr_assert(lt_call_id_keyed(k1) && !lt_call_id_keyed("0123456789abcdef0123456789abcdef") && strcmp(k1, k2) != 0);
  char other[LT_CALL_ID_MAX];
  lt_call_id_for_key("another-tenant", job, "step-1", other);
  cr_assert_str_neq(other, k1, "the id is the tenant's own");
  int64_t since = lt_time_wall_ms();
  record_call_id(tenant, job, "forward_backward", k2);
  int64_t held = record_call_id(tenant, job, "save_state", k2); /* a second record of k2, before the state */
  int fds[2];
  lt_wsess_t *s = start_attempt(tenant, job, since, held, false, fds);
  record_call_id("another-tenant", job, "optim_step", k1);
  int64_t first = record_call_id(tenant, job, "optim_step", k1);
  record_call_id(tenant, job, "optim_step", k1);
  record_call_id(tenant, job, "save_state", k2); /* the state holds k2's first record */
  int64_t last = record_call(tenant, job, "forward");
  char calls[512], want[128];
  read_calls(fds[0], 8000, calls, sizeof calls);
  lt_wsess_destroy(s);
  close(fds[0]);
  close(fds[1]);
  snprintf(want, sizeof want, "%lld optim_step %lld forward", (long long)first, (long long)last);
  cr_assert_str_eq(calls, want, "the executor got [%s], not [%s]", calls, want);
}

/* The calls after the resumed checkpoint run; those it holds do not (the state has them). */
Test(wsess, a_resumed_attempt_skips_what_its_state_holds_and_runs_the_rest) {
  char tenant[40], job[48];
  fresh_ids(tenant, job);
  int64_t since = lt_time_wall_ms();
  record_call(tenant, job, "forward_backward");
  int64_t held = record_call(tenant, job, "save_state");
  int fds[2];
  lt_wsess_t *s = start_attempt(tenant, job, since, held, false, fds);
  int64_t next = record_call(tenant, job, "optim_step");
  expect_calls(s, fds, next, "optim_step");
}

/* A call's body goes from the store once its answer is in the log (no attempt reads it again),
 * not with the session: a long session's bodies do not pile up. A call still unanswered keeps
 * its body; a keyed call's leaves its digest (what the API compares a retry with). */
Test(wsess, a_calls_body_goes_once_its_answer_is_recorded) {
  char tenant[40], job[48], cid[3][LT_CALL_ID_MAX], okey[3][256];
  fresh_ids(tenant, job);
  int64_t since = lt_time_wall_ms();
  int fds[2];
  lt_wsess_t *s = start_attempt(tenant, job, since, 0, false, fds);
  lt_crypto_dek_t *dek;
  cr_assert_eq(lt_crypto_dek_import(&dek, tenant, "dek-1", key, err, sizeof err), LT_OK, "%s", err);
  const char *body = "{\"data\":[{\"tokens\":[1,2,3],\"targets\":[2,3,4],\"weights\":[1,1,1]}]}";
  int64_t seq[3];
  for (int i = 0; i < 3; i++) { /* 0 and 1 without a key, 2 with one */
    if (i < 2) cr_assert_eq(lt_crypto_random_id(cid[i]), LT_OK);
    else lt_call_id_for_key(tenant, job, "step-9", cid[i]);
    snprintf(okey[i], sizeof okey[i], "sessions/%s/%s/calls/%s", tenant, job, cid[i]);
    cr_assert_eq(lt_sealed_put(store, dek, okey[i], body, strlen(body), NULL, err, sizeof err), LT_OK, "%s", err);
    seq[i] = record_call_body(tenant, job, "forward_backward", cid[i], okey[i]);
  }
  char calls[512], want[160];
  read_calls(fds[0], 5000, calls, sizeof calls);
  snprintf(want, sizeof want, "%lld forward_backward %lld forward_backward %lld forward_backward", (long long)seq[0],
           (long long)seq[1], (long long)seq[2]);
  cr_assert_str_eq(calls, want, "the executor got [%s]", calls);
  for (int i = 0; i < 3; i += 2) { /* 0 and 2 answered; 1 not */
    lt_proto_result_t r = {.seq = seq[i], .kind = "forward_backward", .ok = true, .step = 0, .tokens = 3, .loss = 1.5,
                           .grad_norm = NAN, .duration_ms = 1, .body = "{\"loss\":1.5}"};
    lt_wsess_result(s, &r);
  }
  lt_store_info_t info;
  lt_err_t e = LT_OK;
  for (int i = 0; i < 3; i += 2)
    lt_test_wait_until((e = lt_store_head(store, okey[i], &info, err, sizeof err)) == LT_ERR_NOT_FOUND, 10000, 50,
                       "the answered call %d's body is still there (%s)", i, lt_err_str(e));
  cr_expect_eq(lt_store_head(store, okey[1], &info, err, sizeof err), LT_OK, "the unanswered call's body went: %s", err);
  char rkey[256], dkey[300];
  snprintf(rkey, sizeof rkey, "sessions/%s/%s/results/%lld", tenant, job, (long long)seq[0]);
  cr_expect_eq(lt_store_head(store, rkey, &info, err, sizeof err), LT_OK, "the result stays: %s", err);
  snprintf(dkey, sizeof dkey, "%s.digest", okey[0]);
  cr_expect_eq(lt_store_head(store, dkey, &info, err, sizeof err), LT_ERR_NOT_FOUND, "a call without a key has no digest");
  /* the keyed call's digest: its body's, as the API computes a retry's */
  snprintf(dkey, sizeof dkey, "%s.digest", okey[2]);
  void *d = NULL;
  size_t dl = 0;
  cr_assert_eq(lt_sealed_get(store, dek, dkey, 4096, &d, &dl, err, sizeof err), LT_OK, "%s", err);
  json_t *j = json_loads("{\"data\":[{\"weights\":[1,1,1],\"targets\":[2,3,4],\"tokens\":[1,2,3]}]}", 0, NULL);
  char hex[65];
  cr_assert(lt_call_body_digest(j, hex));
  cr_expect(dl == 64 && memcmp(d, hex, 64) == 0, "the digest is not the body's (keys in any order): %.*s", (int)dl,
            (const char *)d);
  json_decref(j);
  free(d);
  lt_wsess_destroy(s);
  close(fds[0]);
  close(fds[1]);
  lt_crypto_dek_destroy(dek);
}
