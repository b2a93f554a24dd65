/* lathe admin drain: drains a running worker from anywhere the broker is reachable, as SIGTERM on
 * its host would (docs/DESIGN.md §9).
 *
 *   lathe admin drain WORKER [--reason TEXT] [--wait S]
 *
 * Reads lathe.workers for WORKER's newest heartbeat (an unknown worker, or one not heard from in
 * STALE_MS by this host's clock, is refused: there is no running process to drain), writes a
 * WorkerDrainRequested on lathe.control under WORKER's key naming that heartbeat (which ties it to
 * the worker's current run: a later run does not drain on it), signed with a key derived from the
 * master key (the worker acts on nothing else), then waits up to S seconds (30; 0: not at all) for a heartbeat of WORKER that
 * says draining. The worker's attempts then checkpoint and stop and are queued again, uncharged; a
 * process that is only a worker exits once none holds a slot (exit 0: a systemd unit with
 * Restart=on-failure stays stopped), one with other roles keeps them. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_cli_args.h"
#include "lt_crypto.h"
#include "lt_recmac.h"
#include "lt_time.h"

#define STALE_MS 60000 /* a heartbeat older than this: the worker is not running */

static void usage(FILE *f) {
  fprintf(f, "usage: lathe admin drain WORKER [--reason TEXT] [--wait S]\n"
             "\nAsks the running worker WORKER (its heartbeat's id) to drain, as SIGTERM on its host would:\n"
             "it takes no more work, its attempts checkpoint and stop and are queued again (not charged),\n"
             "and a process that is only a worker exits once none holds a slot. The request is signed\n"
             "with the master key; the worker ignores any other. Waits up to S seconds (30; 0: not at\n"
             "all) for the worker's heartbeat to say it drains. Reads the environment as `lathe admin`.\n");
}

/* The newest heartbeat of each worker, read from the compacted lathe.workers until a quiet second. */
typedef struct {
  int64_t at;          /* occurred_at of the newest heartbeat of the worker asked for; 0: none */
  bool draining;       /* what it said */
  char event_id[64];   /* its event_id: the request names it */
  char seen[512];      /* the other workers' ids, ", "-separated, for the message when it is unknown */
} hb_t;

/* Whether id is one of the ", "-separated names of list. */
static bool listed(const char *list, const char *id) {
  size_t n = strlen(id);
  for (const char *p = list; (p = strstr(p, id)); p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0')) return true;
  return false;
}

static void note(lt_avro_decoder_t *dec, const lt_bus_msg_t *m, const char *worker, hb_t *h) {
  size_t len = 0;
  const void *v = lt_bus_msg_value(m, &len);
  lt_avro_record_t *rec;
  const char *wid = NULL;
  int64_t at = 0;
  bool draining = false;
  if (!v || lt_avro_decode(dec, v, len, &rec, NULL, 0) || strcmp(lt_avro_record_type(rec), "WorkerHeartbeat") != 0 ||
      lt_avro_get_string(rec, "worker_id", &wid, NULL))
    return;
  lt_avro_get_long(rec, "occurred_at", &at);
  lt_avro_get_bool(rec, "draining", &draining);
  if (strcmp(wid, worker) == 0) {
    const char *eid = "";
    lt_avro_get_string(rec, "event_id", &eid, NULL);
    if (at >= h->at) {
      h->at = at;
      h->draining = draining;
      snprintf(h->event_id, sizeof h->event_id, "%s", eid);
    }
  } else if (!listed(h->seen, wid) && strlen(h->seen) + strlen(wid) + 3 < sizeof h->seen) {
    snprintf(h->seen + strlen(h->seen), sizeof h->seen - strlen(h->seen), "%s%s", h->seen[0] ? ", " : "", wid);
  }
}

#define MAX_PARTS 64

/* Reads lathe.workers: from its beginning up to the end it had when asked (every worker's newest
 * heartbeat; that end into ends[]), or, with until_draining, from ends[] until WORKER says it drains
 * or deadline_ms. */
static int read_heartbeats(lt_bus_conf_t *bus, lt_avro_decoder_t *dec, const char *topic, const char *worker,
                           bool until_draining, int64_t deadline_ms, int64_t ends[MAX_PARTS], hb_t *h) {
  char err[512] = "";
  lt_bus_consumer_t *c = NULL;
  lt_bus_admin_t *adm = NULL;
  lt_bus_tp_t parts[MAX_PARTS], pos[MAX_PARTS];
  int np = 0;
  lt_err_t e = lt_bus_admin_new(bus, &adm, err, sizeof err);
  if (!e) e = lt_bus_admin_describe_topic(adm, topic, 10000, &np, err, sizeof err);
  lt_bus_admin_destroy(adm);
  if (!e && np > MAX_PARTS) e = lt_errf(err, sizeof err, LT_ERR_INVALID, "%s has more than %d partitions", topic, MAX_PARTS);
  for (int i = 0; !e && i < np; i++) parts[i] = (lt_bus_tp_t){.topic = topic, .partition = i};
  if (!e) e = lt_bus_consumer_new(bus, NULL, &c, err, sizeof err);
  if (!e) e = lt_bus_consumer_watermarks(c, parts, (size_t)np, NULL, 10000, err, sizeof err); /* before fetching */
  int64_t hw[MAX_PARTS];
  for (int i = 0; !e && i < np; i++) { /* the heartbeat that says draining may come before we fetch */
    hw[i] = parts[i].offset;
    if (!until_draining) ends[i] = hw[i];
    parts[i].offset = until_draining ? (ends[i] >= 0 ? ends[i] : LT_BUS_OFFSET_BEGINNING) : LT_BUS_OFFSET_BEGINNING;
  }
  if (!e) e = lt_bus_consumer_assign(c, parts, (size_t)np, err, sizeof err);
  if (e) {
    fprintf(stderr, "lathe admin drain: %s (is the broker up? ops/stack up)\n", err);
    lt_bus_consumer_destroy(c);
    return 1;
  }
  if (!until_draining) deadline_ms = lt_time_mono_ms() + 30000;
  for (;;) {
    /* read to the end: the position (what poll returns next, past markers and compacted gaps) at
     * each partition's end when we started */
    bool done = !until_draining;
    memcpy(pos, parts, (size_t)np * sizeof *pos);
    if (done && lt_bus_consumer_position(c, pos, (size_t)np, NULL, 0)) done = false;
    for (int i = 0; i < np && done; i++) done = hw[i] <= 0 || (pos[i].offset != LT_BUS_OFFSET_INVALID && pos[i].offset >= hw[i]);
    if (done || (until_draining && h->draining) || lt_time_mono_ms() >= deadline_ms) break;
    const lt_bus_msg_t *m = NULL;
    lt_err_t pe = lt_bus_consumer_poll(c, 500, &m, err, sizeof err);
    if (pe && pe != LT_ERR_RETRIABLE) {
      fprintf(stderr, "lathe admin drain: reading %s: %s\n", topic, err);
      lt_bus_consumer_destroy(c);
      return 1;
    }
    if (m) note(dec, m, worker, h);
  }
  lt_bus_consumer_destroy(c);
  if (!until_draining && lt_time_mono_ms() >= deadline_ms) {
    fprintf(stderr, "lathe admin drain: %s was not read to its end within 30 s\n", topic);
    return 1;
  }
  return 0;
}

/* The signed request, on lathe.control under the worker's key. */
static int write_request(lt_bus_conf_t *bus, lt_avro_registry_t *reg, const lt_crypto_kek_t *kek, const char *worker,
                         const char *heartbeat, const char *reason) {
  char err[512] = "", topic[128];
  lt_avro_record_t *rec = NULL;
  lt_bus_producer_t *p = NULL;
  lt_recmac_key_t *mac = NULL;
  const uint8_t *bytes;
  size_t len;
  int rc = 1;
  lt_bus_topic_name(bus, "control", topic, sizeof topic);
  if (lt_recmac_key_new(kek, LT_RECMAC_OPERATOR, &mac, err, sizeof err) ||
      lt_avro_record_new(reg, "WorkerDrainRequested", &rec, err, sizeof err) || lt_avro_record_stamp(rec, "admin/cli") ||
      lt_avro_set_string(rec, "worker_id", worker) || lt_avro_set_string(rec, "heartbeat_event_id", heartbeat) ||
      lt_avro_set_string(rec, "reason", reason) ||
      lt_avro_record_encode(rec, &bytes, &len, err, sizeof err) || lt_bus_producer_new(bus, NULL, &p, err, sizeof err)) {
    fprintf(stderr, "lathe admin drain: %s\n", err[0] ? err : lt_avro_record_error(rec));
    goto out;
  }
  if (lt_recmac_produce_sync(p, mac, topic, "control", worker, bytes, len, 15000, err, sizeof err)) {
    fprintf(stderr, "lathe admin drain: the request was not written: %s\n", err);
    goto out;
  }
  rc = 0;
out:
  lt_bus_producer_destroy(p, 5000);
  lt_avro_record_destroy(rec);
  lt_recmac_key_destroy(mac);
  return rc;
}

enum { O_REASON = 256, O_WAIT };

int lt_cli_admin_drain(int argc, char **argv) {
  static const struct option opts[] = {{"reason", required_argument, NULL, O_REASON},
                                       {"wait", required_argument, NULL, O_WAIT},
                                       {0}};
  lt_cli_args_t a = {.what = "admin drain", .usage = usage, .opts = opts, .min = 1, .max = 1};
  const char *reason = "";
  double wait_s = 30;
  int o;
  while ((o = lt_cli_args_next(&a, argc, argv)) >= 0) {
    if (o == O_REASON) reason = a.value;
    else if (!lt_cli_args_num(&a, "--wait", 0, 3600, true, &wait_s)) return 2;
  }
  if (o != LT_CLI_ARGS_END) return a.status;
  const char *worker = a.operands[0];
  if (strlen(reason) > 500) return lt_cli_args_fail(&a, "--reason is at most 500 bytes");
  char err[512] = "out of memory", topic[128];
  lt_bus_conf_t *bus = lt_bus_conf_new();
  lt_avro_registry_t *reg = NULL;
  lt_avro_decoder_t *dec = NULL;
  lt_crypto_kek_t *kek = NULL;
  int rc = 1;
  if (!bus || lt_bus_conf_from_env(bus, err, sizeof err) || lt_bus_conf_for_role(bus, "admin", err, sizeof err) ||
      lt_avro_registry_new(&reg, err, sizeof err) || lt_avro_decoder_new(reg, &dec, err, sizeof err) ||
      lt_crypto_kek_from_env(&kek, err, sizeof err)) {
    fprintf(stderr, "lathe admin drain: %s\n", err);
    goto out;
  }
  lt_bus_topic_name(bus, "workers", topic, sizeof topic);
  hb_t h = {0};
  int64_t ends[MAX_PARTS];
  if (read_heartbeats(bus, dec, topic, worker, false, 0, ends, &h)) goto out;
  int64_t age = lt_time_wall_ms() - h.at;
  if (!h.at) {
    fprintf(stderr, "lathe admin drain: no worker \"%s\" has sent a heartbeat; the workers: %s\n", worker,
            h.seen[0] ? h.seen : "(none)");
    goto out;
  }
  if (age > STALE_MS) {
    fprintf(stderr, "lathe admin drain: worker %s's newest heartbeat is %lld s old: it is not running, there is "
                    "nothing to drain\n", worker, (long long)(age / 1000));
    goto out;
  }
  if (h.draining) {
    printf("worker %s drains already\n", worker);
    rc = 0;
    goto out;
  }
  if (write_request(bus, reg, kek, worker, h.event_id, reason)) goto out;
  printf("asked worker %s to drain\n", worker);
  rc = 0;
  if (wait_s > 0) {
    h.draining = false;
    if (read_heartbeats(bus, dec, topic, worker, true, lt_time_mono_ms() + (int64_t)(wait_s * 1000), ends, &h)) {
      rc = 1;
    } else if (h.draining) {
      printf("worker %s drains: its heartbeat says so\n", worker);
    } else {
      fprintf(stderr, "lathe admin drain: worker %s's heartbeat did not say it drains within %.0f s (is it running "
                      "this version? it acts only on a request signed with the same master key)\n", worker, wait_s);
      rc = 1;
    }
  }
out:
  lt_crypto_kek_destroy(kek);
  lt_avro_decoder_destroy(dec);
  lt_avro_registry_destroy(reg);
  lt_bus_conf_destroy(bus);
  return rc;
}
