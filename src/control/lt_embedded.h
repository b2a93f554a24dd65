/* lt_embedded: `lathed --role all --embedded`, the whole service in one process with no server
 * to start — no Kafka broker, no S3 server (docs/DESIGN.md §8: "a local-directory store serves the
 * embedded mode").
 *
 * What it sets up before the roles start:
 *   - Kafka: librdkafka's mock cluster (lt_bus_mock_t), created once and shared by every client
 *     of the process, with every topic of ops/topics.tsv (names with LATHE_TOPIC_PREFIX). Its
 *     brokers listen on loopback TCP ports, so `lathe admin tenant create` and any other Kafka
 *     client on this host reach it through the bootstrap that DIR/env exports.
 *   - the object store: a directory store under DIR/store;
 *   - the master key: LATHE_MASTER_KEY_FILE or LATHE_MASTER_KEY when set, else DIR/master.key,
 *     generated (32 random bytes as hex, mode 0600) on the first start and kept after that.
 * It hands all of this to the roles and to the worker's executor processes through the
 * environment (LATHE_KAFKA_BOOTSTRAP, LATHE_STORE_DIR, LATHE_MASTER_KEY_FILE): the roles read
 * their configuration from it as in every other mode, and executors inherit it.
 *
 * IN MEMORY. The log lives in this process: when it stops, every record — tenants, jobs, their
 * states, artifact publications — is gone. The files under DIR/store stay, but nothing refers to
 * them any more (a new run starts with no tenants; create them again). Keep the local stack or a
 * real cluster for anything that must survive a restart.
 *
 * What the mock cluster does not model (librdkafka 2.0.2, see lt_bus.h and NOTES.md), and so what
 * this mode does not guarantee: zombie fencing of transactional producers (a second scheduler
 * would not fence the first; there is only one here), commit/abort markers (read_committed
 * consumers, such as the publisher, also see records of aborted transactions), topic configs
 * (no compaction or retention: the log only grows while the process runs), replication and
 * durability (acks=all is acknowledged from memory).
 *
 * Process-wide effects, on purpose: lt_embedded_start() calls setenv(). Call it from main before
 * any thread starts. */
#ifndef LT_EMBEDDED_H
#define LT_EMBEDDED_H

#include <stdio.h>

#include "lt_err.h"

typedef struct lt_embedded lt_embedded_t;

typedef struct lt_embedded_conf {
  const char *data_dir;    /* DIR; NULL: "var/embedded" under the current directory */
  const char *topics_file; /* NULL: $LATHE_TOPICS_FILE, else the built-in ops/topics.tsv */
  int brokers;             /* mock brokers (0: 1) */
} lt_embedded_conf_t;

/* Creates DIR (0700) and DIR/store, starts the mock cluster, creates the topics, settles the
 * master key and exports LATHE_KAFKA_BOOTSTRAP, LATHE_STORE_DIR (absolute) and, unless a master
 * key was configured, LATHE_MASTER_KEY_FILE into this process's environment. Overrides an
 * inherited LATHE_KAFKA_BOOTSTRAP and LATHE_STORE_DIR: embedded mode never uses another cluster
 * or store. The caller owns *out (lt_embedded_stop). */
lt_err_t lt_embedded_start(const lt_embedded_conf_t *conf, lt_embedded_t **out, char *errstr,
                           size_t errstr_size);

/* The mock cluster's bootstrap.servers ("127.0.0.1:PORT"). Owned by e. */
const char *lt_embedded_bootstrap(const lt_embedded_t *e);

/* DIR as an absolute path. Owned by e. */
const char *lt_embedded_dir(const lt_embedded_t *e);

/* Writes DIR/env (mode 0600, replaced atomically): `export NAME=VALUE` lines for
 * LATHE_KAFKA_BOOTSTRAP, LATHE_TOPIC_PREFIX, LATHE_MASTER_KEY_FILE (when the key is in a file)
 * and LATHE_API_URL (when api_url is not NULL), so that another shell can
 * `. DIR/env && lathe admin tenant create ...`. Writes the same lines to out when not NULL. The
 * file is valid only while this process runs (the mock's ports change on every start). */
lt_err_t lt_embedded_write_env(lt_embedded_t *e, const char *api_url, FILE *out, char *errstr,
                               size_t errstr_size);

/* Removes DIR/env and stops the mock cluster: every record is gone. Call it after every role
 * (every Kafka client of the process) is destroyed. NULL is a no-op. */
void lt_embedded_stop(lt_embedded_t *e);

#endif
