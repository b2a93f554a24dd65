/* lt_worker_ops: the worker's operator endpoint — /metrics and /healthz over lt_worker_stats —
 * and an operator's request to drain it (lathe admin drain).
 *
 * Apart from lt_worker.c so that the role's logic and what operators read of it stay readable
 * each on its own. The heartbeat lag is the one figure that says a worker is in trouble before
 * its attempts fail: past two thirds of a lease without an acknowledged heartbeat, the worker
 * stops its attempts itself (lt_worker.c, on_tick). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lt_log.h"
#include "lt_metrics.h"
#include "lt_recmac.h"
#include "lt_time.h"
#include "lt_worker.h"
#include "lt_worker_int.h"

/* Seconds since the last acknowledged heartbeat; -1 before the first. */
static double heartbeat_lag_s(const lt_worker_stats_t *st, int64_t now) {
  return st->hb_ok_ms > 0 ? (double)(now - st->hb_ok_ms) / 1000.0 : -1;
}

char *lt_worker_metrics(lt_worker_t *w) {
  static const char *const ends[LT_WORKER_END__COUNT] = {"completed", "stopped", "failed", "lost",
                                                         "unavailable"};
  lt_worker_stats_t st;
  lt_worker_stats(w, &st);
  lt_metrics_t *m = lt_metrics_new();
  lt_metrics_family(m, "lathe_worker_slots", LT_METRIC_GAUGE, "Attempt slots of this worker: all, and busy.");
  lt_metrics_sample(m, (lt_metric_label_t[]){{"state", "total"}, {0}}, st.slots);
  lt_metrics_sample(m, (lt_metric_label_t[]){{"state", "busy"}, {0}}, st.busy);
  lt_metrics_one(m, "lathe_worker_draining", LT_METRIC_GAUGE,
                 "1 while the worker drains (SIGTERM: its attempts checkpoint and stop, it takes no new one).",
                 st.draining ? 1 : 0);
  lt_metrics_one(m, "lathe_worker_pending_dispatches", LT_METRIC_GAUGE,
                 "Dispatches taken and waiting for a free slot.", st.pending);
  lt_metrics_one(m, "lathe_worker_executors_started_total", LT_METRIC_COUNTER, "Executor processes started.",
                 (double)st.started);
  lt_metrics_family(m, "lathe_worker_attempts_ended_total", LT_METRIC_COUNTER,
                    "Attempts ended on this worker, by outcome: completed, stopped on request (cancel, "
                    "preemption), failed (the executor said so, or the attempt could not start), lost (it died or "
                    "was killed), unavailable (the object store stayed away: it never started, or a job's checkpoint "
                    "could not be stored).");
  for (int i = 0; i < LT_WORKER_END__COUNT; i++)
    lt_metrics_sample(m, (lt_metric_label_t[]){{"outcome", ends[i]}, {0}}, (double)st.ended[i]);
  lt_metrics_one(m, "lathe_worker_fetched_bytes_total", LT_METRIC_COUNTER,
                 "Input bytes (datasets, resume state) fetched for the executors started.",
                 (double)st.fetched_bytes);
  lt_metrics_one(m, "lathe_worker_uploaded_bytes_total", LT_METRIC_COUNTER,
                 "Checkpoint bytes uploaded to staging and committed.", (double)st.uploaded_bytes);
  lt_metrics_one(m, "lathe_worker_checkpoints_committed_total", LT_METRIC_COUNTER, "Checkpoints committed.",
                 (double)st.checkpoints);
  lt_metrics_one(m, "lathe_worker_heartbeat_lag_seconds", LT_METRIC_GAUGE,
                 "Seconds since the broker last acknowledged a heartbeat (-1 before the first).",
                 heartbeat_lag_s(&st, lt_time_wall_ms()));
  return lt_metrics_text(m, NULL);
}

int lt_worker_health(lt_worker_t *w, char **json) {
  lt_worker_stats_t st;
  lt_worker_stats(w, &st);
  double lag = heartbeat_lag_s(&st, lt_time_wall_ms());
  /* Healthy while heartbeats get through: a few missed ones are the broker's hiccup. */
  double limit = st.heartbeat_ms > 0 ? 5.0 * (double)st.heartbeat_ms / 1000.0 : 5.0;
  bool ok = lag >= 0 && lag <= (limit > 10 ? limit : 10);
  json_t *o = json_pack("{s:s,s:b,s:i,s:i,s:f,s:b}", "role", "worker", "ready", ok, "slots", st.slots, "busy",
                        st.busy, "heartbeat_lag_seconds", lag, "draining", st.draining);
  *json = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return ok ? 200 : 503;
}

/* An operator's request to drain (lathe admin drain): acted on when it is on lathe.control, names
 * this worker and one of this run's heartbeats (the log is read from its beginning: a request made
 * from an earlier run's heartbeat drained that run, not this one), and carries a valid MAC under
 * the master key. */
void lt_worker_drain_requested(lt_worker_t *w, lt_avro_record_t *rec, const lt_bus_msg_t *m) {
  const char *wid = NULL, *hb = NULL, *reason = "";
  char why[256];
  if (!m || strcmp(lt_bus_msg_topic(m), w->t_control) != 0 || lt_avro_get_string(rec, "worker_id", &wid, NULL) ||
      strcmp(wid, w->conf.worker_id) != 0 || lt_avro_get_string(rec, "heartbeat_event_id", &hb, NULL))
    return;
  bool this_run = false;
  for (unsigned i = 0; i < 128 && i < w->hb_next && !this_run; i++) this_run = strcmp(w->hb_ids[i], hb) == 0;
  if (!this_run) return;
  lt_avro_get_string(rec, "reason", &reason, NULL);
  if (!w->op_mac || !lt_recmac_msg_ok(w->op_mac, "control", m, why, sizeof why)) {
    lt_log_warn("worker", "a drain request for this worker at control/%d@%lld is not signed with the master key: "
                "ignored (%s)", (int)lt_bus_msg_partition(m), (long long)lt_bus_msg_offset(m),
                w->op_mac ? why : "no master key here to check it");
    return;
  }
  if (w->draining) return;
  lt_log_info("worker", "an operator asks this worker to drain: %s", reason[0] ? reason : "(no reason given)");
  lt_worker_drain(w);
  if (w->conf.on_drain) w->conf.on_drain(w->conf.on_drain_ctx, reason);
}
