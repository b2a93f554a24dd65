/* lt_confine: an executor's confinement, chosen by the worker and applied by the executor
 * (see lt_confine.h for the list and its reasons). */
#include "lt_confine.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

extern char **environ;

/* An AddressSanitizer or ThreadSanitizer build maps its shadow memory (terabytes of address
 * space, private and writable) before main, so every RLIMIT_DATA is already exceeded and the next
 * allocation of the executor fails; such a build applies no data limit and says so in the report. */
#if defined(__SANITIZE_ADDRESS__)
static const bool asan_build = true;
#else
static const bool asan_build = false;
#endif
#if defined(__SANITIZE_THREAD__)
static const bool tsan_build = true;
#else
static const bool tsan_build = false;
#endif

bool lt_confine_data_limit_applies(void) { return !asan_build && !tsan_build; }

/* ---------------------------------------------------------------- the worker's side */

/* 0 (no limit: the worker's own) or a whole number from lo to hi (unset or empty: dflt); what it
 * counts (unit) names it in the error. */
static lt_err_t env_u64(const char *name, const char *unit, uint64_t lo, uint64_t hi, uint64_t dflt, uint64_t *out,
                        char *errstr, size_t n) {
  const char *v = getenv(name);
  *out = dflt;
  if (!v || !*v) return LT_OK;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end || v[0] < '0' || v[0] > '9' || (x && (x < lo || x > hi))) /* no sign, no space: strtoull takes both */
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "%s=\"%.40s\": expected %s, a whole number from %llu to %llu, or 0 for no limit", name, v, unit,
                   (unsigned long long)lo, (unsigned long long)hi);
  *out = x;
  return LT_OK;
}

lt_err_t lt_confine_conf_from_env(lt_confine_conf_t *c, int slots, char *errstr, size_t n) {
  memset(c, 0, sizeof *c);
  c->uid = c->gid = -1;
  c->netns = c->seccomp = true;
  if (geteuid() == 0) {
    const char *user = getenv("LATHE_EXECUTOR_USER");
    if (!user || !*user) user = "nobody";
    struct passwd *pw = getpwnam(user);
    if (!pw) {
      char *end;
      unsigned long id = strtoul(user, &end, 10);
      if (*end || end == user)
        return lt_errf(errstr, n, LT_ERR_INVALID, "LATHE_EXECUTOR_USER=\"%s\": no such user", user);
      c->uid = c->gid = (int64_t)id;
    } else {
      c->uid = pw->pw_uid;
      c->gid = pw->pw_gid;
    }
    if (c->uid == 0)
      return lt_errf(errstr, n, LT_ERR_INVALID, "LATHE_EXECUTOR_USER=\"%s\" is root: executors must not run as root",
                     user);
  }
  struct sysinfo si;
  uint64_t ram_mb = sysinfo(&si) == 0 ? (uint64_t)si.totalram * si.mem_unit >> 20 : 8192;
  uint64_t mb = ram_mb / (uint64_t)(slots > 0 ? slots : 1);
  if (mb < 2048) mb = 2048;
  /* the floors: an executor needs its libraries mapped, a few descriptors and its compute threads */
  lt_err_t err = env_u64("LATHE_EXECUTOR_DATA_MB", "MiB", 256, 1ull << 30, mb, &mb, errstr, n);
  if (!err) err = env_u64("LATHE_EXECUTOR_NOFILE", "descriptors", 16, 1ull << 20, 256, &c->nofile, errstr, n);
  if (!err) err = env_u64("LATHE_EXECUTOR_NPROC", "processes and threads", 8, 1ull << 22, 4096, &c->nproc, errstr, n);
  c->data_bytes = mb << 20;
  return err;
}

/* Variables an executor may keep: they tune libraries, never name a secret or a server. */
static bool env_allowed(const char *kv) {
  /* LATHE_LOG_FORMAT and LATHE_INSTANCE: the executor logs as the worker does (lt_log.h). */
  static const char *const exact[] = {"LANG=", "TZ=", "PATH=", "LATHE_LOG_FORMAT=", "LATHE_INSTANCE=", NULL};
  static const char *const prefixes[] = {"LC_", "OPENBLAS_", "GOTO", "OMP_", "CUDA_", "NVIDIA_", "ASAN_",
                                         "UBSAN_", "LSAN_", "TSAN_", NULL};
  for (size_t i = 0; exact[i]; i++)
    if (strncmp(kv, exact[i], strlen(exact[i])) == 0) return true;
  for (size_t i = 0; prefixes[i]; i++)
    if (strncmp(kv, prefixes[i], strlen(prefixes[i])) == 0) return true;
  return false;
}

char **lt_confine_env(const lt_confine_conf_t *c) {
  size_t count = 0;
  for (char **e = environ; *e; e++) count++;
  char **env = calloc(count + 3, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  const char *asan_opts = "";
  for (char **e = environ; *e; e++) {
    if (asan_build && strncmp(*e, "ASAN_OPTIONS=", 13) == 0) {
      asan_opts = *e + 13;
      continue;
    }
    if (env_allowed(*e) && !(env[k++] = strdup(*e))) goto nomem;
  }
  if (asan_build) {
    /* LeakSanitizer stops the process with ptrace at exit, which the filter refuses ("fatal
     * error"): a confined executor of such a build runs without the leak check. */
    char opts[1024];
    snprintf(opts, sizeof opts, "ASAN_OPTIONS=%s%sdetect_leaks=0", asan_opts, *asan_opts ? ":" : "");
    if (!(env[k++] = strdup(opts))) goto nomem;
  }
  char conf[256];
  snprintf(conf, sizeof conf, "%s=%" PRId64 ",%" PRId64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%d,%d", LT_CONFINE_ENV,
           c->uid, c->gid, c->data_bytes, c->nofile, c->nproc, c->netns, c->seccomp);
  if (!(env[k++] = strdup(conf))) goto nomem;
  return env;
nomem:
  lt_confine_env_free(env);
  return NULL;
}

void lt_confine_env_free(char **env) {
  if (!env) return;
  for (char **e = env; *e; e++) free(*e);
  free(env);
}

/* ---------------------------------------------------------------- the executor's side */

lt_err_t lt_confine_conf_from_executor_env(lt_confine_conf_t *c, char *errstr, size_t n) {
  const char *v = getenv(LT_CONFINE_ENV);
  int netns = 0, sc = 0;
  memset(c, 0, sizeof *c);
  if (!v || sscanf(v, "%" SCNd64 ",%" SCNd64 ",%" SCNu64 ",%" SCNu64 ",%" SCNu64 ",%d,%d", &c->uid, &c->gid,
                   &c->data_bytes, &c->nofile, &c->nproc, &netns, &sc) != 7)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s is %s: an executor is started by a worker, which sets it",
                   LT_CONFINE_ENV, v ? "malformed" : "not set");
  c->netns = netns;
  c->seccomp = sc;
  return LT_OK;
}

/* Appends a line to the report of what could not be applied. */
static void note(char *report, size_t size, const char *what) {
  size_t used = strlen(report);
  snprintf(report + used, size - used, "%s%s", used ? "; " : "", what);
}

/* Clears every capability of the calling thread (after a user namespace gave it a full set). */
static int drop_caps(void) {
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2];
  memset(d, 0, sizeof d);
  return (int)syscall(SYS_capset, &h, d);
}

/* Step 2: a network namespace with nothing in it. */
static lt_err_t own_netns(const lt_confine_conf_t *c, char *report, size_t rs, char *errstr, size_t n) {
  if (!c->netns) return LT_OK;
  if (geteuid() == 0) {
    if (unshare(CLONE_NEWNET) != 0)
      return lt_errf(errstr, n, LT_ERR_IO, "confine: unshare(CLONE_NEWNET) as root: %s", strerror(errno));
    return LT_OK;
  }
  if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) {
    note(report, rs, "no network namespace (not root and no user namespaces)");
    return LT_OK;
  }
  if (drop_caps() != 0) return lt_errf(errstr, n, LT_ERR_IO, "confine: capset: %s", strerror(errno));
  return LT_OK;
}

static lt_err_t limit(int resource, const char *name, uint64_t value, char *errstr, size_t n) {
  struct rlimit r = {(rlim_t)value, (rlim_t)value};
  if (setrlimit(resource, &r) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "confine: setrlimit(%s, %" PRIu64 "): %s", name, value, strerror(errno));
  return LT_OK;
}

/* Step 3. */
static lt_err_t limits(const lt_confine_conf_t *c, char *report, size_t rs, char *errstr, size_t n) {
  lt_err_t err = limit(RLIMIT_CORE, "RLIMIT_CORE", 0, errstr, n);
  if (!err && c->data_bytes && !lt_confine_data_limit_applies())
    note(report, rs, asan_build ? "no RLIMIT_DATA (an AddressSanitizer build: its shadow memory exceeds any limit)"
                                : "no RLIMIT_DATA (a ThreadSanitizer build: its shadow memory exceeds any limit)");
  else if (!err && c->data_bytes)
    err = limit(RLIMIT_DATA, "RLIMIT_DATA", c->data_bytes, errstr, n);
  if (!err && c->nofile) err = limit(RLIMIT_NOFILE, "RLIMIT_NOFILE", c->nofile, errstr, n);
  bool own_uid = geteuid() == 0 && c->uid > 0;
  if (!err && c->nproc && own_uid) err = limit(RLIMIT_NPROC, "RLIMIT_NPROC", c->nproc, errstr, n);
  else if (c->nproc && !own_uid) note(report, rs, "no RLIMIT_NPROC (it would count the worker's own processes)");
  return err;
}

/* Step 4. */
static lt_err_t drop_user(const lt_confine_conf_t *c, char *report, size_t rs, char *errstr, size_t n) {
  if (geteuid() != 0) {
    note(report, rs, "runs as the worker's uid (the worker is not root)");
    return LT_OK;
  }
  if (c->uid <= 0 || c->gid < 0)
    return lt_errf(errstr, n, LT_ERR_INVALID, "confine: the worker is root but named no uid to run as");
  if (setgroups(0, NULL) != 0 || setresgid((gid_t)c->gid, (gid_t)c->gid, (gid_t)c->gid) != 0 ||
      setresuid((uid_t)c->uid, (uid_t)c->uid, (uid_t)c->uid) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "confine: cannot switch to uid %" PRId64 " gid %" PRId64 ": %s", c->uid,
                   c->gid, strerror(errno));
  if (setuid(0) == 0 || geteuid() == 0)
    return lt_errf(errstr, n, LT_ERR_INTERNAL, "confine: uid 0 could be regained after the switch");
  return LT_OK;
}

/* Step 6: the filter. Rules answer EPERM; clone3 answers ENOSYS (its flags are in memory the
 * filter cannot read, and the C library then uses clone()). */
static lt_err_t load_filter(char *errstr, size_t n) {
  static const int denied[] = {
      SCMP_SYS(ptrace), SCMP_SYS(process_vm_readv), SCMP_SYS(process_vm_writev), SCMP_SYS(kcmp),
      SCMP_SYS(pidfd_getfd), SCMP_SYS(process_madvise), SCMP_SYS(mount), SCMP_SYS(umount2),
      SCMP_SYS(pivot_root), SCMP_SYS(chroot), SCMP_SYS(unshare), SCMP_SYS(setns), SCMP_SYS(bpf),
      SCMP_SYS(perf_event_open), SCMP_SYS(userfaultfd), SCMP_SYS(io_uring_setup), SCMP_SYS(io_uring_enter),
      SCMP_SYS(io_uring_register), SCMP_SYS(kexec_load), SCMP_SYS(kexec_file_load), SCMP_SYS(init_module),
      SCMP_SYS(finit_module), SCMP_SYS(delete_module), SCMP_SYS(reboot), SCMP_SYS(swapon), SCMP_SYS(swapoff),
      SCMP_SYS(syslog), SCMP_SYS(acct), SCMP_SYS(quotactl), SCMP_SYS(settimeofday), SCMP_SYS(clock_settime),
      SCMP_SYS(clock_adjtime), SCMP_SYS(adjtimex), SCMP_SYS(sethostname), SCMP_SYS(setdomainname),
      SCMP_SYS(iopl), SCMP_SYS(ioperm), SCMP_SYS(keyctl), SCMP_SYS(add_key), SCMP_SYS(request_key),
      SCMP_SYS(open_by_handle_at), SCMP_SYS(name_to_handle_at), SCMP_SYS(fanotify_init),
      SCMP_SYS(lookup_dcookie), SCMP_SYS(personality), SCMP_SYS(mknod), SCMP_SYS(mknodat)};
  const uint64_t ns_flags = CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC |
                            CLONE_NEWUTS | CLONE_NEWCGROUP;
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return lt_errf(errstr, n, LT_ERR_NOMEM, "confine: seccomp_init failed");
  int rc = 0;
  for (size_t i = 0; i < sizeof denied / sizeof *denied && rc == 0; i++)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), denied[i], 0);
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_NE, AF_UNIX));
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socketpair), 1, SCMP_A0(SCMP_CMP_NE, AF_UNIX));
  /* clone() with any namespace flag: one rule per flag (rules of a syscall are or-ed). */
  for (uint64_t bit = 1; bit && rc == 0; bit <<= 1)
    if (ns_flags & bit)
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, bit, bit));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  /* Threads only, no processes: a child would outlive the executor (PDEATHSIG is not inherited),
   * keep its descriptors and race the worker's cleanup. */
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(fork), 0);
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(vfork), 0);
  /* Limits of itself only (setrlimit and getrlimit are prlimit64(0, ...)). */
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(prlimit64), 1, SCMP_A0(SCMP_CMP_NE, 0));
  /* Signals only to itself (raise() is tgkill(own pid, own thread)): not to another executor
   * under the same uid, nor to its process group. */
  uint64_t self = (uint64_t)getpid();
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(kill), 1, SCMP_A0(SCMP_CMP_NE, self));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(tgkill), 1, SCMP_A0(SCMP_CMP_NE, self));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(tkill), 0);
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(rt_sigqueueinfo), 1, SCMP_A0(SCMP_CMP_NE, self));
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(rt_tgsigqueueinfo), 1, SCMP_A0(SCMP_CMP_NE, self));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(pidfd_send_signal), 0);
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(pidfd_open), 0);
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) return lt_errf(errstr, n, LT_ERR_IO, "confine: the seccomp filter did not load: %s", strerror(-rc));
  return LT_OK;
}

lt_err_t lt_confine_apply(const lt_confine_conf_t *c, int keep_max, char *report, size_t rs, char *errstr,
                          size_t n) {
  report[0] = '\0';
  if (close_range((unsigned)keep_max + 1, ~0U, 0) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "confine: close_range: %s", strerror(errno));
  lt_err_t err = own_netns(c, report, rs, errstr, n);
  if (!err) err = limits(c, report, rs, errstr, n);
  if (!err) err = drop_user(c, report, rs, errstr, n);
  if (err) return err;
  if (prctl(PR_SET_DUMPABLE, 0) != 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "confine: prctl: %s", strerror(errno));
  if (c->seccomp) return load_filter(errstr, n);
  note(report, rs, "no seccomp filter (turned off)");
  return LT_OK;
}

/* ---------------------------------------------------------------- spawning */

lt_err_t lt_confine_spawn(const char *path, const lt_confine_conf_t *c, const int inputs[LT_CONFINE_INPUTS], pid_t *pid,
                          int *in_fd, int *out_fd, char *errstr, size_t n) {
  /* Close-on-exec everywhere: another executor must not inherit this one's pipes or inputs (the
   * dup2s below clear the flag on the child's own 0, 1 and 3-14). The inputs are first moved
   * above the numbers they go to, so that no dup2 overwrites a source another one still needs. */
  int in[2] = {-1, -1}, out[2] = {-1, -1}, high[LT_CONFINE_INPUTS], null_fd = -1;
  for (int i = 0; i < LT_CONFINE_INPUTS; i++) high[i] = -1;
  char **env = lt_confine_env(c);
  lt_err_t err = env ? LT_OK : LT_ERR_NOMEM;
  if (!err && (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)))
    err = lt_errf(errstr, n, LT_ERR_IO, "pipe: %s", strerror(errno));
  if (!err && (null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
    err = lt_errf(errstr, n, LT_ERR_IO, "/dev/null: %s", strerror(errno));
  for (int i = 0; i < LT_CONFINE_INPUTS && !err; i++)
    if ((high[i] = fcntl(inputs[i] >= 0 ? inputs[i] : null_fd, F_DUPFD_CLOEXEC, 16)) < 0)
      err = lt_errf(errstr, n, LT_ERR_IO, "dup: %s", strerror(errno));
  if (!err) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    for (int i = 0; i < LT_CONFINE_INPUTS; i++) posix_spawn_file_actions_adddup2(&fa, high[i], 3 + i);
    posix_spawn_file_actions_addclosefrom_np(&fa, 3 + LT_CONFINE_INPUTS);
    char *argv[] = {(char *)"lathed", (char *)"--role", (char *)"executor", NULL};
    int rc = posix_spawn(pid, path, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) err = lt_errf(errstr, n, LT_ERR_IO, "cannot start the executor %s: %s", path, strerror(rc));
  }
  for (int i = 0; i < LT_CONFINE_INPUTS; i++)
    if (high[i] >= 0) close(high[i]);
  if (null_fd >= 0) close(null_fd);
  if (in[0] >= 0) close(in[0]);
  if (out[1] >= 0) close(out[1]);
  lt_confine_env_free(env);
  if (err) {
    if (in[1] >= 0) close(in[1]);
    if (out[0] >= 0) close(out[0]);
    return err;
  }
  *in_fd = in[1];
  *out_fd = out[0];
  return LT_OK;
}
