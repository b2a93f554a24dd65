/* lt_confine: what an executor may do, decided by the worker and applied by the executor to itself.
 *
 * An executor parses and trains on customer data, so a bug there must reach nothing but its own
 * attempt (docs/DESIGN.md §5a). The worker spawns it with a minimal environment (no master key, no
 * store or bus settings: lt_confine_env) and only its pipes and input descriptors open; the
 * executor, before it reads a byte of its assignment, applies lt_confine_apply():
 *
 *   1. every descriptor above keep_max closed (close_range);
 *   2. its own network namespace with no interface but a down loopback (unshare(CLONE_NEWNET)
 *      while it is still root; unprivileged, inside a new user namespace when the kernel allows);
 *   3. rlimits: RLIMIT_DATA (private writable memory: heap, anonymous maps — not RLIMIT_AS,
 *      which the CUDA runtime's address-space reservations exceed), RLIMIT_NOFILE, RLIMIT_NPROC
 *      (only under the executor's own uid: it counts every process of a uid), RLIMIT_CORE 0;
 *   4. an unprivileged uid and gid (LATHE_EXECUTOR_USER, default nobody) with no supplementary
 *      groups, when it started as root: setresuid clears every capability;
 *   5. not dumpable (another executor under the same uid cannot open its /proc/PID/mem) and
 *      PR_SET_NO_NEW_PRIVS (no exec regains a privilege);
 *   6. a seccomp filter (libseccomp) that answers EPERM to, and only to:
 *      - socket() of any family but AF_UNIX, and socketpair() likewise (no network even if a
 *        namespace could not be made);
 *      - ptrace, process_vm_readv/writev, kcmp, pidfd_getfd, process_madvise (other processes'
 *        memory); kill and tgkill of any process but itself, tkill, pidfd_open and
 *        pidfd_send_signal (another executor runs under the same uid);
 *      - mount, umount2, pivot_root, chroot, unshare, setns, and clone() with any CLONE_NEW*
 *        flag; clone3 answers ENOSYS, so the C library falls back to clone(), whose flags the
 *        filter can read;
 *      - bpf, perf_event_open, userfaultfd, io_uring_setup/enter/register (which act outside the
 *        filter), kexec_load, kexec_file_load, init_module, finit_module, delete_module, reboot,
 *        swapon, swapoff, syslog, acct, quotactl, settimeofday, clock_settime, clock_adjtime,
 *        adjtimex, sethostname, setdomainname, iopl, ioperm, keyctl, add_key, request_key,
 *        open_by_handle_at, name_to_handle_at, fanotify_init, lookup_dcookie, personality,
 *        mknod, mknodat;
 *      everything else — threads (clone without namespaces, futex), mmap/mprotect, ioctl (the
 *      GPU driver's), files, pipes, signals, AF_UNIX — stays allowed. A syscall of another
 *      architecture (x32, i386) kills the process (libseccomp's default for a foreign arch).
 *
 * What could not be applied (not root: no uid change, no RLIMIT_NPROC; no user namespaces: no
 * network namespace) is written into the report, which the executor prints to its stderr, the
 * worker's log.
 *
 * Threads: lt_confine_apply() only while the process is single-threaded (unshare requires it);
 * the rest has no state. */
#ifndef LT_CONFINE_H
#define LT_CONFINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lt_err.h"

/* The one environment variable that carries the confinement from the worker to the executor. */
#define LT_CONFINE_ENV "LATHE_EXECUTOR_CONFINE"

typedef struct lt_confine_conf {
  int64_t uid, gid;      /* to switch to when root; -1: stay */
  uint64_t data_bytes;   /* RLIMIT_DATA; 0: none */
  uint64_t nofile;       /* RLIMIT_NOFILE; 0: none */
  uint64_t nproc;        /* RLIMIT_NPROC (with a uid of its own); 0: none */
  bool netns;            /* a network namespace of its own */
  bool seccomp;          /* the filter above */
} lt_confine_conf_t;

/* The worker's choice, from its environment: LATHE_EXECUTOR_USER (a user name or uid; default
 * "nobody" when the worker is root, ignored otherwise), LATHE_EXECUTOR_DATA_MB (default: the
 * machine's memory divided by slots, at least 2048), LATHE_EXECUTOR_NOFILE (256),
 * LATHE_EXECUTOR_NPROC (4096). LT_ERR_INVALID naming the variable for a bad value or an unknown
 * user. */
lt_err_t lt_confine_conf_from_env(lt_confine_conf_t *c, int slots, char *errstr, size_t errstr_size);

/* Whether lt_confine_apply() sets RLIMIT_DATA: false in an AddressSanitizer or ThreadSanitizer
 * build (the report says so). */
bool lt_confine_data_limit_applies(void);

/* The executor's environment: the allowed variables of environ (locale, TZ, PATH, OPENBLAS_*,
 * OMP_*, CUDA_*, NVIDIA_*, the sanitizers' *SAN_OPTIONS, with detect_leaks=0 added in an
 * AddressSanitizer build: LeakSanitizer needs ptrace, which the filter refuses) and
 * LT_CONFINE_ENV=<c>; never a LATHE_*
 * variable of the worker. NULL-terminated; the caller frees it with lt_confine_env_free. */
char **lt_confine_env(const lt_confine_conf_t *c);
void lt_confine_env_free(char **env);

/* Reads LT_CONFINE_ENV (the executor side); LT_ERR_INVALID when it is missing or malformed. */
lt_err_t lt_confine_conf_from_executor_env(lt_confine_conf_t *c, char *errstr, size_t errstr_size);

/* Applies c to the calling process (steps 1-6 above), keeping descriptors 0..keep_max. Whatever
 * could not be applied for lack of privilege is listed in report ("" when all was); a failure
 * of a step that should have worked is an error naming it, and the executor must then not run. */
lt_err_t lt_confine_apply(const lt_confine_conf_t *c, int keep_max, char *report, size_t report_size, char *errstr,
                          size_t errstr_size);

/* Descriptors an executor inherits beside 0-2: 3 + i for inputs[i]: its datasets, resume state
 * and base model (3-6), then a gang's connections (7-14, lt_worker_gang.h). */
#define LT_CONFINE_INPUTS 12

/* Spawns the executor at path (`lathed --role executor`) with c's environment, its stdin and
 * stdout on new pipes (*in_fd: the write end of its stdin; *out_fd: the read end of its stdout,
 * both close-on-exec) and inputs[i] on its descriptor 3 + i (-1: /dev/null there); no other
 * descriptor of the caller reaches it. */
lt_err_t lt_confine_spawn(const char *path, const lt_confine_conf_t *c, const int inputs[LT_CONFINE_INPUTS], pid_t *pid,
                          int *in_fd, int *out_fd, char *errstr, size_t errstr_size);

#endif
