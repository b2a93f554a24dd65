/* lt_worker_setup: a worker's one-time setup (see lt_worker_setup.h). */
#include "lt_worker_setup.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "lt_log.h"
#include "lt_scrub.h"

void lt_worker_conf_defaults(lt_worker_conf_t *c, int max_slots) {
  if (c->slots > max_slots) c->slots = max_slots;
  if (c->threads_per_executor <= 0) c->threads_per_executor = 1;
  if (!c->work_root) c->work_root = "/tmp";
  if (!c->mem_root) c->mem_root = "/dev/shm";
  if (!c->executor_path) c->executor_path = "/proc/self/exe";
  if (!c->heartbeat_ms) c->heartbeat_ms = 1000;
  if (!c->kill_deadline_ms) c->kill_deadline_ms = 30000;
  if (!c->watchdog_ms) c->watchdog_ms = 600000;
  if (!c->session_idle_ms) c->session_idle_ms = 300000;
  if (c->store_retry_ms <= 0) c->store_retry_ms = 120000;
}

lt_err_t lt_worker_devices(const char *backend, int *slots, lt_worker_devices_t *out, char *errstr, size_t n) {
  memset(out, 0, sizeof *out);
  bool autod = !backend || !backend[0] || strcmp(backend, "auto") == 0;
  if (!autod && strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0)
    return lt_errf(errstr, n, LT_ERR_INVALID, "LATHE_WORKER_BACKEND: want auto, cpu or cuda, got '%s'", backend);
  char why[512] = "";
  if (autod || strcmp(backend, "cuda") == 0) {
    lt_err_t err = lt_cuda_devices(out->gpus, LT_WORKER_MAX_GPUS, &out->ngpus, why, sizeof why);
    if (err || out->ngpus <= 0) {
      out->ngpus = 0;
      if (!autod) return lt_errf(errstr, n, LT_ERR_UNAVAILABLE, "LATHE_WORKER_BACKEND=cuda, but no GPU: %s", why);
      lt_log_info(NULL, "worker: training on the cpu (no GPU: %s)", why);
    }
    if (out->ngpus > LT_WORKER_MAX_GPUS) out->ngpus = LT_WORKER_MAX_GPUS;
  }
  snprintf(out->backend, sizeof out->backend, "%s", out->ngpus > 0 ? "cuda" : "cpu");
  if (out->ngpus == 0) {
    if (*slots <= 0) *slots = 1;
    return LT_OK;
  }
  if (*slots <= 0) *slots = out->ngpus;
  if (*slots > out->ngpus)
    return lt_errf(errstr, n, LT_ERR_INVALID, "LATHE_WORKER_SLOTS: %d slots, but the cuda backend has one GPU a "
                   "slot and this machine has %d", *slots, out->ngpus);
  lt_log_info(NULL, "worker: training on %d GPU%s (%s, %.1f GiB), one a slot", out->ngpus, out->ngpus > 1 ? "s" : "",
              out->gpus[0].name, (double)out->gpus[0].memory_bytes / (1 << 30));
  return LT_OK;
}

lt_err_t lt_worker_assign_control(const lt_bus_conf_t *bus, lt_bus_consumer_t **out, char *errstr, size_t n) {
  lt_err_t err = lt_bus_consumer_new(bus, NULL, out, errstr, n);
  if (err) return err;
  lt_bus_admin_t *admin = NULL;
  lt_bus_tp_t parts[64];
  char names[3][128];
  size_t np = 0;
  err = lt_bus_admin_new(bus, &admin, errstr, n);
  const char *bases[3] = {"jobs", "control", "tenants"};
  for (int b = 0; b < 3 && !err; b++) {
    int count = 0;
    lt_bus_topic_name(bus, bases[b], names[b], sizeof names[b]);
    err = lt_bus_admin_describe_topic(admin, names[b], 10000, &count, errstr, n);
    for (int p = 0; !err && p < count && np < 64; p++)
      parts[np++] = (lt_bus_tp_t){.topic = names[b], .partition = p, .offset = LT_BUS_OFFSET_BEGINNING};
  }
  lt_bus_admin_destroy(admin);
  return err ? err : lt_bus_consumer_assign(*out, parts, np, errstr, n);
}

/* One dispatch group per deployment (topic prefix), like the scheduler's: workers of another
 * prefix on the same broker must not share its rebalances. */
lt_err_t lt_worker_join_dispatch(const lt_bus_conf_t *bus, const char *const topics[LT_CLASS__COUNT],
                                 lt_bus_rebalance_cb *rebalance_cb, void *opaque, lt_bus_consumer_t **out,
                                 char *errstr, size_t n) {
  char group[160];
  lt_bus_topic_name(bus, "worker-group", group, sizeof group);
  lt_bus_consumer_opts_t co = {.group_id = group, .rebalance_cb = rebalance_cb, .opaque = opaque};
  /* A dead worker's dispatch partitions go to the living within seconds, not librdkafka's 45 s. */
  lt_bus_conf_t *dconf = lt_bus_conf_dup(bus);
  if (!dconf) return LT_ERR_NOMEM;
  lt_err_t err = lt_bus_conf_set(dconf, "session.timeout.ms", "6000", errstr, n);
  if (!err) err = lt_bus_conf_set(dconf, "heartbeat.interval.ms", "1500", errstr, n);
  if (!err) err = lt_bus_consumer_new(dconf, &co, out, errstr, n);
  lt_bus_conf_destroy(dconf);
  if (err) return err;
  return lt_bus_consumer_subscribe(*out, topics, LT_CLASS__COUNT, errstr, n);
}

/* What a previous process of this worker left in dir, one of its parents: killed or crashed
 * mid-attempt, it never scrubbed its attempts' directories (the executors' plaintext on the
 * memory file system). Scrubbed and removed at start, before any attempt; only this worker's
 * own directory (named by its id, a directory of its user: never through a link). */
static lt_err_t sweep_parent(const char *dir, char *errstr, size_t n) {
  struct stat st;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) return LT_OK;
  int64_t zeroed = 0;
  char err[512];
  if (lt_scrub_tree(dir, &zeroed, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot scrub what a previous run of this worker left: %s; remove %s by hand",
                   err, dir);
  if (zeroed > 0)
    lt_log_info("worker", "scrubbed %lld bytes a previous run of this worker left in %s", (long long)zeroed, dir);
  return LT_OK;
}

/* <mem_parent>.lock, which every live process of this worker id holds shared (*lock_fd), into
 * *alone: whether this process took it exclusively, so that no live process of the id uses the
 * directories and what is in them was left by a dead one. Taken under <mem_parent>.gate (*gate_fd,
 * held exclusively until the caller closes it, after its sweep and its downgrade to shared): a
 * process of the id that starts meanwhile waits there, so it never finds the lock free in the
 * moment the downgrade lets it go (flock(2) does not convert atomically), and one that starts
 * while another runs takes it shared too: a later restart of the first sweeps nothing of it. */
static lt_err_t lock_id(const char *mem_parent, int *gate_fd, int *lock_fd, bool *alone, char *errstr, size_t n) {
  char path[530];
  snprintf(path, sizeof path, "%s.gate", mem_parent);
  *gate_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (*gate_fd < 0 || flock(*gate_fd, LOCK_EX) != 0) return lt_errf(errstr, n, LT_ERR_IO, "%s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s.lock", mem_parent);
  *lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (*lock_fd < 0) return lt_errf(errstr, n, LT_ERR_IO, "%s: %s", path, strerror(errno));
  *alone = flock(*lock_fd, LOCK_EX | LOCK_NB) == 0;
  if (!*alone) {
    lt_log_warn("worker", "another live process holds %s: it runs as this worker (LATHE_INSTANCE); nothing is swept",
                path);
    if (flock(*lock_fd, LOCK_SH | LOCK_NB) != 0) return lt_errf(errstr, n, LT_ERR_IO, "%s: %s", path, strerror(errno));
  }
  return LT_OK;
}

/* Where executors' plaintext goes: a memory file system, never a disk. */
lt_err_t lt_worker_confinement(const lt_worker_conf_t *conf, lt_confine_conf_t *confine, char *work_parent,
                               char *mem_parent, int *lock_fd, char *errstr, size_t n) {
  struct statfs fs;
  if (!conf->store || !conf->kek)
    return lt_errf(errstr, n, LT_ERR_INVALID, "the worker needs the object store and the master key");
  if (statfs(conf->mem_root, &fs) != 0 || (fs.f_type != TMPFS_MAGIC && fs.f_type != RAMFS_MAGIC))
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "%s (LATHE_WORKER_MEM_DIR) is not a memory file system (tmpfs): executors' plaintext would be "
                   "written to a disk; name a tmpfs directory",
                   conf->mem_root);
  lt_err_t err = lt_confine_conf_from_env(confine, conf->slots, errstr, n);
  if (err) return err;
  /* The attempts' directories go into a directory of this worker's that can be passed through
   * but not listed (0711): executors share a uid, and one must not find another's by name. */
  snprintf(work_parent, 512, "%s/lathe-%s", conf->work_root, conf->worker_id);
  snprintf(mem_parent, 512, "%s/lathe-%s", conf->mem_root, conf->worker_id);
  const char *parents[] = {work_parent, mem_parent};
  bool alone = false;
  int gate = -1;
  err = lock_id(mem_parent, &gate, lock_fd, &alone, errstr, n);
  for (int i = 0; i < 2 && !err; i++) {
    struct stat st;
    if (alone && (err = sweep_parent(parents[i], errstr, n))) break;
    if ((mkdir(parents[i], 0711) != 0 && errno != EEXIST) || lstat(parents[i], &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != geteuid() || chmod(parents[i], 0711) != 0)
      err = lt_errf(errstr, n, LT_ERR_IO, "%s: not a directory of this worker's user (%s)", parents[i], strerror(errno));
  }
  if (!err && alone && flock(*lock_fd, LOCK_SH) != 0) /* under the gate: no other process of the id meanwhile */
    err = lt_errf(errstr, n, LT_ERR_IO, "%s.lock: %s", mem_parent, strerror(errno));
  if (err && alone) flock(*lock_fd, LOCK_UN); /* failed: the next process of the id is not refused for it */
  if (gate >= 0) close(gate);
  if (err) return err;
  if (geteuid() != 0)
    lt_log_warn("worker", "not root: executors run as this worker's uid, without RLIMIT_NPROC, and in "
            "a network namespace only where the kernel allows user namespaces (each executor logs what it could "
            "not apply)");
  else
    lt_log_info("worker", "executors run as uid %lld gid %lld, %llu MiB of data each",
                (long long)confine->uid, (long long)confine->gid, (unsigned long long)(confine->data_bytes >> 20));
  return LT_OK;
}
