/* lt_job: the fold of job records. Each test tries to break invariant 1 (replay gives the same
 * state), 2 (a fenced attempt changes nothing) or 3 (the log settles races). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_job.h"

static lt_job_table_t *T;

static void setup(void) { cr_assert_eq(lt_job_table_new(&T), LT_OK); }
static void teardown(void) { lt_job_table_destroy(T); }

static lt_job_event_t ev(lt_job_event_type_t type, const char *job, int32_t attempt) {
  static int seq;
  lt_job_event_t e = {0};
  e.type = type;
  e.job_id = job;
  e.tenant_id = "t1";
  e.attempt = attempt;
  e.occurred_at_ms = 1000 + seq++;
  e.worker_id = "w1";
  e.base_model = "tiny";
  e.dataset_id = "d1";
  return e;
}

static lt_job_outcome_t apply(lt_job_event_t e) {
  lt_job_outcome_t o;
  char err[128];
  cr_assert_eq(lt_job_apply(T, &e, &o, err, sizeof err), LT_OK, "%s", err);
  return o;
}

static lt_job_state_t state(const char *job) {
  const lt_job_t *j = lt_job_get(T, job);
  cr_assert_not_null(j);
  return j->state;
}

/* Submitted, accepted, dispatched as attempt 1 and started. */
static void run_to_running(const char *job) {
  apply(ev(LT_EV_JOB_SUBMITTED, job, 0));
  apply(ev(LT_EV_JOB_ACCEPTED, job, 0));
  apply(ev(LT_EV_JOB_DISPATCHED, job, 1));
  apply(ev(LT_EV_ATTEMPT_STARTED, job, 1));
}

TestSuite(job, .init = setup, .fini = teardown);

Test(job, lifecycle_reaches_completed_through_every_state) {
  apply(ev(LT_EV_JOB_SUBMITTED, "j", 0));
  cr_assert_eq(state("j"), LT_JOB_SUBMITTED);
  apply(ev(LT_EV_JOB_ACCEPTED, "j", 0));
  cr_assert_eq(state("j"), LT_JOB_QUEUED);
  apply(ev(LT_EV_JOB_DISPATCHED, "j", 1));
  cr_assert_eq(state("j"), LT_JOB_DISPATCHED);
  apply(ev(LT_EV_ATTEMPT_STARTED, "j", 1));
  cr_assert_eq(state("j"), LT_JOB_RUNNING);
  lt_job_event_t c = ev(LT_EV_CHECKPOINT_COMMITTED, "j", 1);
  c.step = 10;
  c.final_checkpoint = true;
  c.object_key = "staging/t1/j/1/10/";
  c.sha256_hex = "ab";
  apply(c);
  apply(ev(LT_EV_JOB_COMPLETED, "j", 1));
  const lt_job_t *j = lt_job_get(T, "j");
  cr_assert_eq(j->state, LT_JOB_COMPLETED);
  cr_assert_eq(j->ckpt_step, 10);
  cr_assert(j->ckpt_final);
  cr_assert_str_eq(j->ckpt_key, "staging/t1/j/1/10/");
}

Test(job, stale_attempt_records_are_ignored_after_a_new_dispatch) {
  run_to_running("j");
  lt_job_event_t lost = ev(LT_EV_ATTEMPT_STOPPED, "j", 1);
  lost.stop_reason = LT_STOP_LOST;
  apply(lost);
  cr_assert_eq(state("j"), LT_JOB_QUEUED);
  apply(ev(LT_EV_JOB_DISPATCHED, "j", 2));
  /* The old attempt wakes up and reports: nothing of it counts. */
  lt_job_event_t c = ev(LT_EV_CHECKPOINT_COMMITTED, "j", 1);
  c.step = 99;
  cr_assert_eq(apply(c), LT_JOB_IGNORED);
  cr_assert_eq(apply(ev(LT_EV_ATTEMPT_STARTED, "j", 1)), LT_JOB_IGNORED);
  cr_assert_eq(apply(ev(LT_EV_JOB_COMPLETED, "j", 1)), LT_JOB_IGNORED);
  const lt_job_t *j = lt_job_get(T, "j");
  cr_assert_eq(j->state, LT_JOB_DISPATCHED);
  cr_assert_eq(j->attempt, 2);
  cr_assert_eq(j->ckpt_step, 0);
  cr_assert_eq(j->failed_attempts, 1);
  /* A dispatch that does not raise the attempt number is a duplicate. */
  cr_assert_eq(apply(ev(LT_EV_JOB_DISPATCHED, "j", 2)), LT_JOB_IGNORED);
  cr_assert_eq(apply(ev(LT_EV_JOB_DISPATCHED, "j", 1)), LT_JOB_IGNORED);
}

Test(job, cancel_recorded_before_completion_means_cancelled) {
  run_to_running("j");
  apply(ev(LT_EV_CANCEL_REQUESTED, "j", 0));
  apply(ev(LT_EV_JOB_COMPLETED, "j", 1));
  cr_assert_eq(state("j"), LT_JOB_CANCELLED);
  /* and nothing after it changes the outcome */
  cr_assert_eq(apply(ev(LT_EV_JOB_COMPLETED, "j", 1)), LT_JOB_IGNORED);
  cr_assert_eq(apply(ev(LT_EV_JOB_FAILED, "j", 1)), LT_JOB_IGNORED);
  cr_assert_eq(state("j"), LT_JOB_CANCELLED);
}

Test(job, completion_recorded_before_cancel_means_completed) {
  run_to_running("j");
  apply(ev(LT_EV_JOB_COMPLETED, "j", 1));
  cr_assert_eq(apply(ev(LT_EV_CANCEL_REQUESTED, "j", 0)), LT_JOB_IGNORED);
  cr_assert_eq(apply(ev(LT_EV_JOB_CANCELLED, "j", 0)), LT_JOB_IGNORED);
  cr_assert_eq(state("j"), LT_JOB_COMPLETED);
}

Test(job, first_terminal_record_wins) {
  run_to_running("j");
  lt_job_event_t f = ev(LT_EV_JOB_FAILED, "j", 1);
  f.reason = "executor ran out of memory";
  apply(f);
  cr_assert_eq(apply(ev(LT_EV_JOB_COMPLETED, "j", 1)), LT_JOB_IGNORED);
  cr_assert_eq(state("j"), LT_JOB_FAILED);
  cr_assert_str_eq(lt_job_get(T, "j")->reason, "executor ran out of memory");
}

Test(job, preempted_attempt_returns_the_job_to_the_queue_with_its_checkpoint) {
  run_to_running("j");
  apply(ev(LT_EV_PREEMPT_REQUESTED, "j", 1));
  cr_assert_eq(state("j"), LT_JOB_PREEMPTING);
  lt_job_event_t c = ev(LT_EV_CHECKPOINT_COMMITTED, "j", 1);
  c.step = 7;
  apply(c);
  lt_job_event_t s = ev(LT_EV_ATTEMPT_STOPPED, "j", 1);
  s.stop_reason = LT_STOP_PREEMPT;
  apply(s);
  const lt_job_t *j = lt_job_get(T, "j");
  cr_assert_eq(j->state, LT_JOB_QUEUED);
  cr_assert_eq(j->ckpt_step, 7);
  cr_assert_eq(j->failed_attempts, 0, "a preemption is not a failure");
}

/* An attempt whose inputs the worker could not fetch (the store away past its retry window) never
 * ran: back to the queue without spending the job's attempts (counted apart, for the scheduler's
 * own bound), its detail the job's reason, and a lost attempt before it still reads as the last
 * one that ran (a session's restart). */
Test(job, an_attempt_stopped_unavailable_requeues_without_counting_as_a_failure) {
  run_to_running("j");
  lt_job_event_t lost = ev(LT_EV_ATTEMPT_STOPPED, "j", 1);
  lost.stop_reason = LT_STOP_LOST;
  lost.reason = "lease expired";
  apply(lost);
  for (int32_t a = 2; a <= 6; a++) {
    apply(ev(LT_EV_JOB_DISPATCHED, "j", a));
    apply(ev(LT_EV_ATTEMPT_STARTED, "j", a));
    lt_job_event_t s = ev(LT_EV_ATTEMPT_STOPPED, "j", a);
    s.stop_reason = LT_STOP_UNAVAILABLE;
    s.reason = "cannot read the training dataset: connection refused";
    cr_assert_eq(apply(s), LT_JOB_APPLIED);
    const lt_job_t *j = lt_job_get(T, "j");
    cr_assert_eq(j->state, LT_JOB_QUEUED, "attempt %d", a);
    cr_assert_eq(j->failed_attempts, 1, "attempt %d: an unavailable stop counted as a failure", a);
    cr_assert_eq(j->unavailable_stops, a - 1);
    cr_assert(j->last_stop_failed, "attempt %d: the lost attempt before it no longer reads as the last that ran", a);
    cr_assert_str_eq(j->reason, "cannot read the training dataset: connection refused");
  }
  lt_job_stop_reason_t r;
  cr_assert_eq(lt_job_stop_reason_parse("unavailable", &r), LT_OK);
  cr_assert_eq(r, LT_STOP_UNAVAILABLE);
  cr_assert_str_eq(lt_job_stop_reason_name(LT_STOP_UNAVAILABLE), "unavailable");
}

/* A training session that went idle (docs/DESIGN.md §5): parked by its live attempt only, queued
 * but parked after the stop, woken by SessionWoken, and running again after a new dispatch. */
Test(job, an_idle_session_parks_until_woken_and_only_its_live_attempt_parks_it) {
  run_to_running("s");
  lt_job_event_t stale = ev(LT_EV_SESSION_IDLE, "s", 0);
  cr_assert_eq(apply(stale), LT_JOB_IGNORED, "an attempt that is not the live one parks nothing");
  cr_assert_eq(apply(ev(LT_EV_SESSION_WOKEN, "s", 0)), LT_JOB_IGNORED, "nothing to wake");
  lt_job_event_t idle = ev(LT_EV_SESSION_IDLE, "s", 1);
  idle.step = 12;
  cr_assert_eq(apply(idle), LT_JOB_APPLIED);
  lt_job_event_t s = ev(LT_EV_ATTEMPT_STOPPED, "s", 1);
  s.stop_reason = LT_STOP_PREEMPT;
  apply(s);
  const lt_job_t *j = lt_job_get(T, "s");
  cr_assert(j->state == LT_JOB_QUEUED && j->parked && j->parked_seq == 12 && !j->last_stop_failed);
  lt_job_event_t wake = ev(LT_EV_SESSION_WOKEN, "s", 0);
  wake.step = 12; /* an earlier park's wake, written late: for a call the session has run */
  cr_assert_eq(apply(wake), LT_JOB_IGNORED, "a wake for a call at or before the park");
  wake.step = 13;
  cr_assert_eq(apply(wake), LT_JOB_APPLIED);
  cr_assert(!lt_job_get(T, "s")->parked, "woken: the scheduler may dispatch it");
  cr_assert_eq(apply(wake), LT_JOB_IGNORED, "a second wake is a duplicate");
  apply(ev(LT_EV_JOB_DISPATCHED, "s", 2));
  apply(ev(LT_EV_ATTEMPT_STARTED, "s", 2));
  cr_assert_eq(state("s"), LT_JOB_RUNNING);
}

Test(job, cancel_of_a_running_job_waits_for_the_stop_then_the_cancelled_record) {
  run_to_running("j");
  apply(ev(LT_EV_CANCEL_REQUESTED, "j", 0));
  cr_assert_eq(state("j"), LT_JOB_RUNNING);
  cr_assert(lt_job_get(T, "j")->cancel_requested);
  lt_job_event_t s = ev(LT_EV_ATTEMPT_STOPPED, "j", 1);
  s.stop_reason = LT_STOP_CANCEL;
  apply(s);
  cr_assert(lt_job_get(T, "j")->attempt_stopped);
  cr_assert_neq(state("j"), LT_JOB_QUEUED, "a cancelled job is never requeued");
  apply(ev(LT_EV_JOB_CANCELLED, "j", 0));
  apply(ev(LT_EV_CLEANUP_DONE, "j", 1));
  cr_assert_eq(state("j"), LT_JOB_CANCELLED);
  cr_assert(lt_job_get(T, "j")->cleanup_done);
}

Test(job, cleanup_of_a_fenced_attempt_does_not_count_for_the_live_one) {
  run_to_running("j");
  lt_job_event_t lost = ev(LT_EV_ATTEMPT_STOPPED, "j", 1);
  lost.stop_reason = LT_STOP_LOST;
  apply(lost);
  apply(ev(LT_EV_JOB_DISPATCHED, "j", 2));
  cr_assert_eq(apply(ev(LT_EV_CLEANUP_DONE, "j", 1)), LT_JOB_IGNORED);
  cr_assert(!lt_job_get(T, "j")->cleanup_done);
  apply(ev(LT_EV_JOB_CANCELLED, "j", 2));
  cr_assert_eq(apply(ev(LT_EV_CLEANUP_DONE, "j", 2)), LT_JOB_APPLIED);
  cr_assert(lt_job_get(T, "j")->cleanup_done);
}

Test(job, rejected_job_never_reaches_the_queue) {
  apply(ev(LT_EV_JOB_SUBMITTED, "j", 0));
  lt_job_event_t r = ev(LT_EV_JOB_REJECTED, "j", 0);
  r.reason = "hyperparameters.learning_rate: 5 is above the maximum 1";
  apply(r);
  cr_assert_eq(apply(ev(LT_EV_JOB_ACCEPTED, "j", 0)), LT_JOB_IGNORED);
  cr_assert_eq(apply(ev(LT_EV_JOB_DISPATCHED, "j", 1)), LT_JOB_IGNORED);
  cr_assert_eq(state("j"), LT_JOB_REJECTED);
}

Test(job, a_job_not_accepted_cannot_be_dispatched) {
  apply(ev(LT_EV_JOB_SUBMITTED, "j", 0));
  cr_assert_eq(apply(ev(LT_EV_JOB_DISPATCHED, "j", 1)), LT_JOB_IGNORED);
  cr_assert_eq(state("j"), LT_JOB_SUBMITTED);
}

Test(job, control_record_for_an_unknown_job_is_reported_not_created) {
  cr_assert_eq(apply(ev(LT_EV_JOB_ACCEPTED, "ghost", 0)), LT_JOB_UNKNOWN_JOB);
  cr_assert_null(lt_job_get(T, "ghost"));
  cr_assert_eq(lt_job_count(T), 0);
}

Test(job, a_record_naming_another_tenant_does_not_touch_the_job) {
  run_to_running("j");
  lt_job_event_t c = ev(LT_EV_JOB_CANCELLED, "j", 0);
  c.tenant_id = "t2";
  cr_assert_eq(apply(c), LT_JOB_IGNORED);
  cr_assert_eq(state("j"), LT_JOB_RUNNING);
}

Test(job, resubmission_of_the_same_id_changes_nothing) {
  run_to_running("j");
  lt_job_event_t s = ev(LT_EV_JOB_SUBMITTED, "j", 0);
  s.base_model = "other";
  cr_assert_eq(apply(s), LT_JOB_IGNORED);
  cr_assert_str_eq(lt_job_get(T, "j")->base_model, "tiny");
}

Test(job, bad_records_name_the_field) {
  char err[128] = "";
  lt_job_event_t e = ev(LT_EV_JOB_SUBMITTED, NULL, 0);
  cr_assert_eq(lt_job_apply(T, &e, NULL, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "job_id"), "%s", err);
  char longid[200];
  memset(longid, 'x', sizeof longid - 1);
  longid[sizeof longid - 1] = 0;
  e = ev(LT_EV_JOB_SUBMITTED, longid, 0);
  cr_assert_eq(lt_job_apply(T, &e, NULL, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "longer than"), "%s", err);
  e = ev(LT_EV_JOB_SUBMITTED, "j", 0);
  e.tenant_id = "";
  cr_assert_eq(lt_job_apply(T, &e, NULL, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "tenant_id"), "%s", err);
  cr_assert_eq(lt_job_count(T), 0, "a bad record leaves nothing behind");
}

/* A random but valid-looking log over many jobs: records of every type, stale attempts,
 * cancels and completions racing. */
static size_t random_log(lt_job_event_t *out, size_t cap, unsigned seed, char ids[][16], int njobs) {
  srand(seed);
  size_t n = 0;
  for (int i = 0; i < njobs; i++) {
    snprintf(ids[i], 16, "job-%04d", i);
    out[n++] = ev(LT_EV_JOB_SUBMITTED, ids[i], 0);
  }
  while (n < cap) {
    lt_job_event_t e = ev((lt_job_event_type_t)(1 + rand() % (LT_EV__COUNT - 1)), ids[rand() % njobs],
                          rand() % 4);
    e.step = rand() % 100;
    e.stop_reason = (lt_job_stop_reason_t)(rand() % LT_STOP__COUNT);
    e.final_checkpoint = rand() % 5 == 0;
    out[n++] = e;
  }
  return n;
}

Test(job, replaying_the_same_log_twice_gives_the_same_digest) {
  static lt_job_event_t log[20000];
  static char ids[200][16];
  size_t n = random_log(log, 20000, 42, ids, 200);
  for (size_t i = 0; i < n; i++) apply(log[i]);
  char d1[65], d2[65];
  lt_job_digest(T, d1);
  lt_job_table_t *again;
  lt_job_table_new(&again);
  for (size_t i = 0; i < n; i++) lt_job_apply(again, &log[i], NULL, NULL, 0);
  lt_job_digest(again, d2);
  cr_assert_str_eq(d1, d2);
  lt_job_table_destroy(again);
  /* The digest is not blind: one more record changes it. */
  run_to_running("extra");
  lt_job_digest(T, d2);
  cr_assert_str_neq(d1, d2);
}

Test(job, duplicated_delivery_of_every_record_gives_the_same_state) {
  static lt_job_event_t log[20000];
  static char ids[200][16];
  size_t n = random_log(log, 20000, 7, ids, 200);
  for (size_t i = 0; i < n; i++) apply(log[i]);
  lt_job_table_t *dup;
  lt_job_table_new(&dup);
  for (size_t i = 0; i < n; i++) {
    lt_job_apply(dup, &log[i], NULL, NULL, 0);
    lt_job_apply(dup, &log[i], NULL, NULL, 0); /* at-least-once delivery: each record twice */
  }
  char d1[65], d2[65];
  lt_job_digest(T, d1);
  lt_job_digest(dup, d2);
  cr_assert_str_eq(d1, d2);
  /* and the random log really exercised terminal states */
  int terminal = 0;
  for (int i = 0; i < 200; i++) terminal += lt_job_state_is_terminal(lt_job_get(T, ids[i])->state);
  cr_assert_gt(terminal, 20);
  lt_job_table_destroy(dup);
}

Test(job, names_round_trip) {
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    lt_job_class_t back;
    cr_assert_eq(lt_job_class_parse(lt_job_class_name((lt_job_class_t)c), &back), LT_OK);
    cr_assert_eq((int)back, c);
  }
  for (int t = 0; t < LT_EV__COUNT; t++) {
    lt_job_event_type_t back;
    cr_assert_eq(lt_job_event_type_parse(lt_job_event_type_name((lt_job_event_type_t)t), &back), LT_OK);
    cr_assert_eq((int)back, t);
  }
  lt_job_class_t c;
  cr_assert_eq(lt_job_class_parse("urgent", &c), LT_ERR_INVALID);
}
