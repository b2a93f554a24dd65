/* lt_confine: what an executor can still do once confined (workers/lt_confine.h).
 *
 * Each test forks a child that applies the same lt_confine_apply() an executor applies, then
 * tries what a compromised executor would try — open a socket, connect to the broker's port,
 * ptrace, make a namespace, raise a limit — and writes what happened into a pipe; the parent
 * asserts on it. The child's /proc/self/status is read from inside, the way the e2e tests read a
 * running executor's. Run as root (the stack's machines are), the child also drops to nobody;
 * not as root, the tests say so and check what an unprivileged worker can apply. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "lt_confine.h"

static long prctl_dumpable(void) { return prctl(PR_GET_DUMPABLE); }

/* What the child saw, one "name=value" per line. */
static char seen[8192];

static void *idle_thread(void *arg) { return arg; }

static void say(int fd, const char *name, long value) {
  char line[128];
  int n = snprintf(line, sizeof line, "%s=%ld\n", name, value);
  if (write(fd, line, (size_t)n) != n) _exit(3);
}

static long value_of(const char *name) {
  char pat[96];
  snprintf(pat, sizeof pat, "\n%s=", name);
  char *p = strstr(seen, pat);
  cr_assert(p, "the confined child did not report %s; it said:\n%s", name, seen);
  return strtol(p + strlen(pat), NULL, 10);
}

/* A field of /proc/self/status ("CapEff", "NoNewPrivs", "Seccomp", "Uid"), the first number. */
static long status_field(const char *field, int base) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t fl = strlen(field);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, field, fl) == 0 && line[fl] == ':') v = strtol(line + fl + 1, NULL, base);
  if (f) fclose(f);
  return v;
}

/* Connects to 127.0.0.1:port; 0 on success, else errno. */
static int try_connect(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return errno;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = connect(s, (struct sockaddr *)&a, sizeof a) == 0 ? 0 : errno;
  close(s);
  return rc;
}

/* Forks a child that confines itself with c (a descriptor above 3 is open before, to be closed), probes
 * and reports into seen. */
static void run_confined(const lt_confine_conf_t *c, int listen_port) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  int null_fd = open("/dev/null", O_RDONLY);
  int planted = fcntl(null_fd, F_DUPFD, 40); /* a descriptor the worker would have leaked */
  cr_assert(planted > 3);
  close(null_fd);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    if (dup2(p[1], 3) != 3) _exit(2); /* the report channel survives as one of the kept descriptors */
    char report[512], err[512];
    lt_err_t e = lt_confine_apply(c, 3, report, sizeof report, err, sizeof err);
    say(3, "apply", e);
    if (e) {
      dprintf(3, "error=%s\n", err);
      _exit(0);
    }
    dprintf(3, "report=%s\n", report);
    say(3, "planted_open", fcntl(planted, F_GETFD) != -1);
    say(3, "uid", (long)getuid());
    say(3, "cap_eff", status_field("CapEff", 16));
    say(3, "no_new_privs", status_field("NoNewPrivs", 10));
    say(3, "seccomp", status_field("Seccomp", 10));
    say(3, "dumpable", prctl_dumpable());
    errno = 0;
    int s4 = socket(AF_INET, SOCK_STREAM, 0);
    say(3, "inet_errno", s4 < 0 ? errno : 0);
    int s6 = socket(AF_INET6, SOCK_DGRAM, 0);
    say(3, "inet6_errno", s6 < 0 ? errno : 0);
    int nl = socket(AF_NETLINK, SOCK_RAW, 0);
    say(3, "netlink_errno", nl < 0 ? errno : 0);
    int su = socket(AF_UNIX, SOCK_STREAM, 0);
    say(3, "unix_errno", su < 0 ? errno : 0);
    say(3, "connect_errno", try_connect(listen_port));
    errno = 0;
    /* Without the filter, TRACEME would succeed and stop this child at its next signal. */
    say(3, "ptrace_errno", !c->seccomp ? -1 : ptrace(PTRACE_TRACEME, 0, 0, 0) < 0 ? errno : 0);
    say(3, "unshare_errno", unshare(CLONE_NEWNS) < 0 ? errno : 0);
    say(3, "kill_group_errno", kill(0, 0) < 0 ? errno : 0);
    say(3, "kill_self_errno", kill(getpid(), 0) < 0 ? errno : 0);
    say(3, "setuid0_errno", setuid(0) < 0 ? errno : 0);
    struct rlimit r;
    getrlimit(RLIMIT_DATA, &r);
    say(3, "data_limit_mb", (long)(r.rlim_cur >> 20));
    getrlimit(RLIMIT_NOFILE, &r);
    say(3, "nofile", (long)r.rlim_cur);
    r.rlim_cur = r.rlim_max = r.rlim_max + 1;
    say(3, "raise_nofile_errno", setrlimit(RLIMIT_NOFILE, &r) < 0 ? errno : 0);
    /* Threads still start (clone with CLONE_THREAD; clone3 falls back); processes do not. */
    pthread_t th;
    say(3, "thread_ok", pthread_create(&th, NULL, idle_thread, NULL) == 0 && pthread_join(th, NULL) == 0);
    pid_t t = fork();
    if (t == 0) _exit(0);
    say(3, "fork_errno", t < 0 ? errno : 0);
    siginfo_t si = {.si_code = SI_QUEUE};
    say(3, "sigqueue_parent_errno", syscall(SYS_rt_sigqueueinfo, getppid(), 0, &si) < 0 ? errno : 0);
    say(3, "prlimit_parent_errno", prlimit(getppid(), RLIMIT_NOFILE, NULL, &r) < 0 ? errno : 0);
    say(3, "done", 1);
    _exit(0);
  }
  close(p[1]);
  close(planted);
  seen[0] = '\n';
  size_t used = 1;
  ssize_t got;
  while ((got = read(p[0], seen + used, sizeof seen - 1 - used)) > 0) used += (size_t)got;
  seen[used] = '\0';
  close(p[0]);
  int st;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the confined child died: status %d; it said:\n%s", st, seen);
}

/* A listening TCP socket on 127.0.0.1 (what a broker would be); its port into *port. */
static int listener(int *port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(s, 4), 0);
  socklen_t len = sizeof a;
  getsockname(s, (struct sockaddr *)&a, &len);
  *port = ntohs(a.sin_port);
  return s;
}

static lt_confine_conf_t worker_conf(void) {
  lt_confine_conf_t c;
  char err[256];
  unsetenv("LATHE_EXECUTOR_USER");
  setenv("LATHE_EXECUTOR_DATA_MB", "3000", 1);
  cr_assert_eq(lt_confine_conf_from_env(&c, 1, err, sizeof err), LT_OK, "%s", err);
  return c;
}

Test(confine, a_confined_process_has_no_network_no_privileges_no_leaked_fd_and_its_limits) {
  int port, ls = listener(&port);
  cr_assert_eq(try_connect(port), 0, "the probe cannot reach its own listener unconfined");
  lt_confine_conf_t c = worker_conf();
  run_confined(&c, port);
  close(ls);
  cr_assert_eq(value_of("apply"), LT_OK, "lt_confine_apply failed:%s", seen);
  cr_assert_eq(value_of("done"), 1);
  cr_assert_eq(value_of("planted_open"), 0, "a descriptor above the kept ones survived");
  cr_assert_eq(value_of("cap_eff"), 0, "capabilities left: %lx", value_of("cap_eff"));
  cr_assert_eq(value_of("no_new_privs"), 1);
  cr_assert_eq(value_of("seccomp"), 2, "no seccomp filter (Seccomp: %ld)", value_of("seccomp"));
  cr_assert_eq(value_of("dumpable"), 0);
  cr_assert_eq(value_of("inet_errno"), EPERM);
  cr_assert_eq(value_of("inet6_errno"), EPERM);
  cr_assert_eq(value_of("netlink_errno"), EPERM);
  cr_assert_eq(value_of("unix_errno"), 0, "AF_UNIX must stay allowed");
  cr_assert_neq(value_of("connect_errno"), 0, "the confined child reached 127.0.0.1:%d", port);
  cr_assert_eq(value_of("ptrace_errno"), EPERM);
  cr_assert_eq(value_of("unshare_errno"), EPERM);
  cr_assert_eq(value_of("kill_group_errno"), EPERM, "it may signal its process group");
  cr_assert_eq(value_of("kill_self_errno"), 0, "it may not signal itself");
  cr_assert_neq(value_of("setuid0_errno"), 0);
  if (lt_confine_data_limit_applies()) {
    cr_assert_eq(value_of("data_limit_mb"), 3000);
  } else {
    fprintf(stderr, "skipped: the RLIMIT_DATA check (an AddressSanitizer build applies none)\n");
    cr_assert(strstr(seen, "no RLIMIT_DATA"), "the report does not say the data limit is missing:%s", seen);
  }
  cr_assert_eq(value_of("nofile"), 256);
  cr_assert_neq(value_of("raise_nofile_errno"), 0, "a limit could be raised again");
  cr_assert_eq(value_of("thread_ok"), 1, "a confined process cannot start a thread");
  cr_assert_eq(value_of("fork_errno"), EPERM, "a confined process started a process");
  cr_assert_eq(value_of("sigqueue_parent_errno"), EPERM, "rt_sigqueueinfo reached another process");
  cr_assert_eq(value_of("prlimit_parent_errno"), EPERM, "prlimit reached another process's limits");
  if (geteuid() == 0) {
    cr_assert_eq(value_of("uid"), 65534, "root's executor runs as uid %ld, not nobody", value_of("uid"));
  } else {
    cr_log_warn("not root: the uid change and RLIMIT_NPROC were not tested");
    cr_assert(strstr(seen, "report=") && strstr(seen, "worker's uid"), "the report does not say what is missing");
  }
}

Test(confine, without_the_filter_the_network_namespace_alone_keeps_the_broker_out) {
  int port, ls = listener(&port);
  lt_confine_conf_t c = worker_conf();
  c.seccomp = false;
  run_confined(&c, port);
  close(ls);
  cr_assert_eq(value_of("apply"), LT_OK, "lt_confine_apply failed:%s", seen);
  if (strstr(seen, "no network namespace")) {
    cr_log_warn("no network namespace here (not root, no user namespaces): %s", seen);
    return;
  }
  cr_assert_eq(value_of("inet_errno"), 0, "with no filter a socket opens");
  cr_assert_neq(value_of("connect_errno"), 0, "the namespace let the child reach 127.0.0.1:%d", port);
  cr_assert(strstr(seen, "no seccomp filter"), "the report does not say the filter is off:%s", seen);
}

Test(confine, the_executor_environment_holds_no_worker_secret_or_server) {
  setenv("LATHE_MASTER_KEY", "00112233", 1);
  setenv("LATHE_MASTER_KEY_FILE", "/etc/lathe/master.key", 1);
  setenv("LATHE_S3_SECRET_KEY", "secret", 1);
  setenv("LATHE_S3_ACCESS_KEY", "access", 1);
  setenv("LATHE_KAFKA_BOOTSTRAP", "127.0.0.1:9092", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "aws", 1);
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  lt_confine_conf_t c = worker_conf();
  char **env = lt_confine_env(&c);
  cr_assert(env);
  bool blas = false, conf = false, no_leak_check = false;
  for (char **e = env; *e; e++) {
    no_leak_check |= strncmp(*e, "ASAN_OPTIONS=", 13) == 0 && strstr(*e, "detect_leaks=0");
    cr_assert(strncmp(*e, "LATHE_", 6) != 0 || strncmp(*e, LT_CONFINE_ENV "=", strlen(LT_CONFINE_ENV) + 1) == 0,
              "the executor would inherit %s", *e);
    cr_assert(!strstr(*e, "secret") && !strstr(*e, "aws") && !strstr(*e, "00112233"), "leaked: %s", *e);
    blas |= strcmp(*e, "OPENBLAS_CORETYPE=Haswell") == 0;
    conf |= strncmp(*e, LT_CONFINE_ENV "=", strlen(LT_CONFINE_ENV) + 1) == 0;
  }
  cr_assert(blas, "OPENBLAS_CORETYPE, which tunes the engine, was dropped");
  cr_assert(conf, "the confinement itself is not passed on");
  /* an AddressSanitizer build: the leak check, which needs ptrace, is off in executors only */
  cr_assert_eq(no_leak_check, !lt_confine_data_limit_applies(), "ASAN_OPTIONS for the executor: leak check %s",
               no_leak_check ? "off" : "on");
  lt_confine_env_free(env);
}

Test(confine, a_bad_setting_is_refused_naming_the_variable) {
  lt_confine_conf_t c;
  char err[256];
  /* not a number; a sign or a space strtoull would take (" -1" was 2^64 - 1); past the range (a
   * limit that shifted past 64 bits, 3 descriptors); 0 stays "no limit" */
  const char *bad[][2] = {{"LATHE_EXECUTOR_DATA_MB", "lots"},    {"LATHE_EXECUTOR_DATA_MB", " -1"},
                          {"LATHE_EXECUTOR_DATA_MB", "+3000"},   {"LATHE_EXECUTOR_DATA_MB", "17592186044416"},
                          {"LATHE_EXECUTOR_NOFILE", "3"},        {"LATHE_EXECUTOR_NPROC", "-5"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv(bad[i][0], bad[i][1], 1);
    cr_expect_eq(lt_confine_conf_from_env(&c, 1, err, sizeof err), LT_ERR_INVALID, "%s=\"%s\" taken", bad[i][0],
                 bad[i][1]);
    cr_expect(strstr(err, bad[i][0]) && strstr(err, "a whole number from"), "%s", err);
    unsetenv(bad[i][0]);
  }
  setenv("LATHE_EXECUTOR_NOFILE", "0", 1);
  cr_expect_eq(lt_confine_conf_from_env(&c, 1, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(c.nofile, 0, "0: no limit of the executor's own");
  unsetenv("LATHE_EXECUTOR_NOFILE");
  if (geteuid() == 0) {
    setenv("LATHE_EXECUTOR_USER", "root", 1);
    cr_assert_eq(lt_confine_conf_from_env(&c, 1, err, sizeof err), LT_ERR_INVALID);
    cr_assert(strstr(err, "LATHE_EXECUTOR_USER"), "%s", err);
    setenv("LATHE_EXECUTOR_USER", "no-such-user-here", 1);
    cr_assert_eq(lt_confine_conf_from_env(&c, 1, err, sizeof err), LT_ERR_INVALID);
    cr_assert(strstr(err, "no-such-user-here"), "%s", err);
    unsetenv("LATHE_EXECUTOR_USER");
  }
  unsetenv(LT_CONFINE_ENV);
  cr_assert_eq(lt_confine_conf_from_executor_env(&c, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, LT_CONFINE_ENV), "%s", err);
}
