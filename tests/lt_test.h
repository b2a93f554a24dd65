/* lt_test: what the C tests share, so that a test file reads like the behaviour it checks.
 *
 * - waiting: lt_test_msleep and lt_test_wait_until (a condition, a deadline, a failure message);
 *   every wait also fails the test when a child daemon died that should not have;
 * - files and commands: slurp, the tail of a log, a shell command's output, rm -rf;
 * - the environment: the lathe/lathed binaries (LATHE_TEST_LATHE/LATHED), paths under
 *   LATHE_SOURCE_ROOT, the local stack (LATHE_KAFKA_*, LATHE_S3_* from `ops/stack env`), scratch
 *   topic prefixes and their topics, tenants made with `lathe admin tenant create`;
 * - child processes (lathed roles, lathe): started with their output in a log, checked, stopped;
 *   a test that dies takes them with it (PR_SET_PDEATHSIG);
 * - HTTP through lt_client, and the records of a few topics read back from the beginning.
 *
 * Linked into every C test as a static library (tests/meson.build); for tests/ alone. */
#ifndef LT_TEST_H
#define LT_TEST_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_client.h"
#include "lt_store.h"
#include "lt_time.h"

/* ---------------------------------------------------------------- waiting */

void lt_test_msleep(int ms);

/* Evaluates cond every poll_ms (checking the child daemons each time: lt_test_procs_check) until it
 * holds; fails the test with the printf-style message that follows when timeout_ms pass first.
 * cond may have side effects (poll a log, read a status into a variable the message prints). */
#define lt_test_wait_until(cond, timeout_ms, poll_ms, ...)                                                   \
  do {                                                                                                     \
    int64_t lt_test_t0_ = lt_time_mono_ms();                                                               \
    while (!(cond)) {                                                                                      \
      if (lt_time_mono_ms() - lt_test_t0_ >= (timeout_ms)) cr_assert_fail(__VA_ARGS__);                    \
      lt_test_procs_check();                                                                               \
      lt_test_msleep(poll_ms);                                                                             \
    }                                                                                                      \
  } while (0)

/* ---------------------------------------------------------------- files and commands */

/* A whole file, NUL-terminated (caller frees); *len (may be NULL) gets its size. NULL if unreadable. */
char *lt_test_slurp(const char *path, size_t *len);
/* Does the file hold needle? */
bool lt_test_file_has(const char *path, const char *needle);
/* The last ~3 kB of a log, for failure messages (a static buffer: use before the next call). */
const char *lt_test_log_tail(const char *path);
/* Runs a shell command: its stdout (caller frees) and exit status in *rc (may be NULL; -1 when
 * it did not exit normally). */
char *lt_test_run(const char *cmd, int *rc);
/* rm -rf path (expects it to work). */
void lt_test_rm_rf(const char *path);
/* Is this pid gone or a zombie? */
bool lt_test_pid_dead(pid_t pid);

/* ---------------------------------------------------------------- the environment */

/* The binaries under test: LATHE_TEST_LATHE and LATHE_TEST_LATHED (tests/meson.build sets them),
 * else ./lathe and ./lathed. */
const char *lt_test_lathe_bin(void);
const char *lt_test_lathed_bin(void);
/* LATHE_SOURCE_ROOT/rel (the source tree: ops/topics.tsv, tests/reference/...) into out. */
const char *lt_test_source_path(const char *rel, char *out, size_t n);
/* Skips the test unless the local stack's environment is set (broker and object server). */
void lt_test_require_stack(void);
/* A topic prefix no other test uses: TAG<pid>-<8 random hex>. into out. */
void lt_test_scratch_prefix(const char *tag, char *out, size_t n);
/* The bus configuration of the environment (lt_bus_conf_from_env) with the admin principal
 * (lt_bus_conf_for_role): what an operator's tool uses. Caller destroys. */
lt_bus_conf_t *lt_test_bus_env(void);
/* Deletes every record of a partition (DeleteRecords, as retention would on a delete-policy topic)
 * and checks that it holds none: returns its start offset, now its end (> 0: it needs a record). */
int64_t lt_test_empty_partition(const lt_bus_conf_t *conf, const char *topic, int32_t partition);
/* LATHE_KAFKA_CONFIG_DIR/ROLE.properties into out, or NULL when the stack has no principals. */
const char *lt_test_kafka_props(const char *role, char *out, size_t n);
/* Sets role's properties (SASL) on a raw librdkafka configuration; nothing without principals. */
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
void lt_test_rd_conf_auth(rd_kafka_conf_t *rc, const char *role);
/* The bus configuration of the environment under a new scratch prefix (into prefix, from
 * lt_test_scratch_prefix), and an admin client on it (caller destroys both). */
lt_bus_conf_t *lt_test_bus_scratch(const char *tag, char *prefix, size_t n, lt_bus_admin_t **admin);
/* Creates every topic of ops/topics.tsv under conf's lathe.topic.prefix; fails with what to do
 * when the broker is not there. */
void lt_test_topics_create(lt_bus_conf_t *conf, lt_bus_admin_t *admin, int timeout_ms);
/* Deletes the topics whose names start with prefix (best effort: teardown). */
void lt_test_topics_delete(const char *prefix);
/* `lathe admin topics`: the topics of ops/topics.tsv under LATHE_TOPIC_PREFIX, as an operator
 * makes them. */
void lt_test_admin_topics(void);
/* `lathe admin tenant create ID OPTS --json` (opts may be NULL): the new tenant's API key. */
void lt_test_tenant_create(const char *id, const char *opts, char *key, size_t keyn);

/* ---------------------------------------------------------------- child processes */

typedef struct lt_test_proc {
  pid_t pid; /* 0 once reaped */
  char name[32];
  char log[600];
  bool expect_exit; /* stopped or killed on purpose: its death is not a failure */
  bool own_group;   /* leads its own process group: signals go to the whole group */
} lt_test_proc_t;

typedef struct lt_test_spawn {
  const char *name;         /* in failure messages */
  const char *log;          /* stderr, and stdout unless out is set (appended) */
  const char *out;          /* stdout, when not NULL */
  const char *const *argv;  /* NULL-terminated; argv[0] is the program (a path, or a name found on PATH) */
  const char *const *env;   /* NAME=VALUE strings set in the child (NULL-terminated; may be NULL) */
  const char *const *unset; /* names removed from the child's environment (NULL-terminated; may be NULL) */
  bool own_group;           /* the child leads a new process group (its executors can be counted) */
} lt_test_spawn_t;

/* Starts a child process and registers it; the pointer stays valid for the test. */
lt_test_proc_t *lt_test_spawn(const lt_test_spawn_t *s);
/* `lathed --role ROLE` (inside network namespace netns when not NULL; `--port 0 --operator-port 0`
 * for the api role)
 * with LATHE_INSTANCE=name and the extra NAME=VALUE strings env; output into log. */
lt_test_proc_t *lt_test_lathed(const char *name, const char *log, const char *role, const char *netns,
                               const char *const *env);
/* Fails the test if a registered child died that should not have. */
void lt_test_procs_check(void);
/* Has the child exited? Reaps it (pid becomes 0) and gives its wait status. */
bool lt_test_proc_exited(lt_test_proc_t *p, int *status);
/* Sends sig (its death is expected from now on); SIGKILL also reaps it. */
void lt_test_proc_kill(lt_test_proc_t *p, int sig);
/* SIGTERM (a worker drains first: lathed), then SIGKILL when it has not exited within timeout_ms.
 * The wait status, or -1 when it had to be killed or was not running. */
int lt_test_proc_stop(lt_test_proc_t *p, int timeout_ms);
/* The same with signal sig (SIGINT: lathed stops at once, draining nothing). */
int lt_test_proc_stop_by(lt_test_proc_t *p, int sig, int timeout_ms);
/* lt_test_proc_stop, and the test fails unless the child exited with status 0 (in a sanitizer
 * build a leak or an error found at its exit makes it non-zero); its log goes when it did. */
void lt_test_proc_stop_clean(lt_test_proc_t *p, int timeout_ms);
/* Stops every registered child (SIGINT, 10 s each; a group leader's group is killed at once) and
 * forgets them: a suite's fini. */
void lt_test_procs_stop_all(void);
/* The port a child printed as "listening on http[s]://HOST:PORT" in its log (waits up to timeout_ms). */
unsigned lt_test_proc_port(lt_test_proc_t *p, int timeout_ms);
/* The api's operator port (/healthz, /metrics), as it printed it (waits up to timeout_ms). */
unsigned lt_test_proc_operator_port(lt_test_proc_t *p, int timeout_ms);
/* The port of the last line "MARK...://HOST:PORT" a child printed (waits up to timeout_ms):
 * "worker operator endpoints" gives the worker's. */
unsigned lt_test_proc_port_of(lt_test_proc_t *p, const char *mark, int timeout_ms);

/* ---------------------------------------------------------------- HTTP (lt_client) */

/* A client of url with api_key (may be NULL). */
lt_client_t *lt_test_client(const char *url, const char *api_key, int timeout_s);

/* The local stack's object store (LATHE_S3_* from `ops/stack env`), asserting it opens. */
lt_store_t *lt_test_store(void);

/* A mute object store: a loopback socket that takes connections (accept them to see them come) and
 * never answers. Returns the listening socket (non-blocking, close-on-exec); env gets
 * "LATHE_S3_ENDPOINT=127.0.0.1:<port>" for a lathed to be started with. */
int lt_test_mute_store(char *env, size_t n);
/* One request; asserts that the transport worked. */
lt_client_resp_t lt_test_req(lt_client_t *c, const char *method, const char *path, const char *body, size_t len);
/* GET path: the status, 0 when the request did not get an answer (last_body, when not NULL, gets
 * the body or the transport error). */
int lt_test_get_status(lt_client_t *c, const char *path, char *last_body, size_t n);
/* Waits until GET ops_url/healthz answers 200; fails naming its last answer (an api that is
 * starting says what it still reads) and the end of the daemon's log. */
void lt_test_wait_healthy(const char *ops_url, const char *log, int timeout_ms);

/* ---------------------------------------------------------------- the log, read back */

/* Every record of some topics of the current prefix, from the beginning, decoded:
 * {"topic": base name, "partition", "offset", "type", "version" (the writer's schema version), "r": {the
 * record's fields}}. */
typedef struct lt_test_tail lt_test_tail_t;

/* Opens a tail on the topics named by their base names (e.g. "control"), NULL-terminated, under
 * conf's topic prefix (conf NULL: the environment's bus configuration). */
lt_test_tail_t *lt_test_tail_open(const lt_bus_conf_t *conf, const char *const *bases);
void lt_test_tail_close(lt_test_tail_t *t);
/* Takes in whatever arrived, waiting up to ms for the first record. */
void lt_test_tail_poll(lt_test_tail_t *t, int ms);
/* Polls until nothing more arrives for idle_ms: what the topics held up to now is in. */
void lt_test_tail_settle(lt_test_tail_t *t, int idle_ms);
/* The records so far, in the order they were read (borrowed). */
json_t *lt_test_tail_records(lt_test_tail_t *t);
/* The records of topic (base name), type, job and attempt, each NULL or 0 for any, in the order
 * they were read (a job's control records: its partition's offsets). New reference. */
json_t *lt_test_tail_select(lt_test_tail_t *t, const char *topic, const char *type, const char *job, int attempt);

/* A record's field ("r" of a tail record). */
const char *lt_test_rs(json_t *rec, const char *field);
json_int_t lt_test_ri(json_t *rec, const char *field);
bool lt_test_rb(json_t *rec, const char *field);

/* ---------------------------------------------------------------- a relay */

/* A port on loopback where nothing listens (bound, then closed). */
int lt_test_free_port(void);

/* The port of a server of the local stack whose address env var `var` holds (LATHE_S3_ENDPOINT,
 * LATHE_KAFKA_BOOTSTRAP); fails the test unless it is 127.0.0.1:PORT (a relay or proxy in front
 * of it handles a local stack only). */
int lt_test_local_port(const char *var);

/* A store or broker coming back: a thread that listens on 127.0.0.1:port and relays every
 * connection byte for byte to 127.0.0.1:up_port, until lt_test_relay_stop (which closes them). */
typedef struct lt_test_relay lt_test_relay_t;
lt_test_relay_t *lt_test_relay_start(int port, int up_port);
void lt_test_relay_stop(lt_test_relay_t *r); /* NULL is fine */

#endif
