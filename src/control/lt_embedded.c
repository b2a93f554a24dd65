/* lt_embedded: the set-up of `lathed --role all --embedded` (see lt_embedded.h): one shared mock
 * cluster with Lathe's topics, a directory store and a master key, all handed to the roles and
 * executors through the environment, so no role has an embedded special case. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "lt_bus.h"
#include "lt_config.h"
#include "lt_crypto.h"
#include "lt_embedded.h"

struct lt_embedded {
  lt_bus_mock_t *mock;
  char dir[PATH_MAX];      /* absolute */
  char key_file[PATH_MAX + 16]; /* the master key file in use, "" when the key came as text */
  char prefix[128];        /* topic prefix the topics were created with */
  char env_path[PATH_MAX + 8];
};

#define DEFAULT_DIR "var/embedded"

/* mkdir -p; the last component gets `mode`, the ones above it 0755. */
static lt_err_t mkdirs(const char *path, mode_t mode, char *errstr, size_t errstr_size) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: path too long", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
      return lt_errf(errstr, errstr_size, LT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    *p = '/';
  }
  if (mkdir(tmp, mode) != 0 && errno != EEXIST)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  return LT_OK;
}

/* DIR/master.key: kept when it exists (its mode is checked when the key is read), else 32
 * random bytes written as hex into a new 0600 file. O_EXCL: two starts on one DIR cannot make
 * two keys. */
static lt_err_t ensure_key_file(const char *path, char *errstr, size_t errstr_size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) return LT_OK;
  if (fd < 0) return lt_errf(errstr, errstr_size, LT_ERR_IO, "cannot create %s: %s", path, strerror(errno));
  uint8_t key[LT_CRYPTO_KEY_BYTES];
  char hex[2 * LT_CRYPTO_KEY_BYTES + 2];
  lt_err_t e = lt_crypto_random(key, sizeof key);
  if (e) {
    lt_errf(errstr, errstr_size, e, "no random bytes for a master key");
  } else {
    lt_crypto_hex(key, sizeof key, hex);
    strcat(hex, "\n");
    size_t n = strlen(hex);
    if (write(fd, hex, n) != (ssize_t)n || fsync(fd) != 0)
      e = lt_errf(errstr, errstr_size, LT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  }
  OPENSSL_cleanse(key, sizeof key);
  OPENSSL_cleanse(hex, sizeof hex);
  close(fd);
  if (e) unlink(path);
  return e;
}

/* DIR, private (it holds the master key and encrypted customer data), and DIR/store. */
static lt_err_t make_dirs(const char *data_dir, lt_embedded_t *e, char *store, size_t store_size, char *errstr,
                          size_t errstr_size) {
  lt_err_t err = mkdirs(data_dir, 0700, errstr, errstr_size);
  if (err) return err;
  if (!realpath(data_dir, e->dir)) return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: %s", data_dir, strerror(errno));
  snprintf(store, store_size, "%s/store", e->dir);
  if ((err = mkdirs(store, 0700, errstr, errstr_size))) return err;
  snprintf(e->env_path, sizeof e->env_path, "%s/env", e->dir);
  return LT_OK;
}

/* The master key: configured, or DIR/master.key; read once now, so that a bad key stops the
 * start, not the first upload. */
static lt_err_t prepare_master_key(lt_embedded_t *e, char *errstr, size_t errstr_size) {
  const char *kf = getenv("LATHE_MASTER_KEY_FILE"), *kt = getenv("LATHE_MASTER_KEY");
  lt_err_t err;
  if (kf && *kf) {
    if (!realpath(kf, e->key_file))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "LATHE_MASTER_KEY_FILE %s: %s", kf, strerror(errno));
  } else if (!kt || !*kt) {
    snprintf(e->key_file, sizeof e->key_file, "%s/master.key", e->dir);
    if ((err = ensure_key_file(e->key_file, errstr, errstr_size))) return err;
  }
  if (e->key_file[0] && setenv("LATHE_MASTER_KEY_FILE", e->key_file, 1) != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "setenv: %s", strerror(errno));
  lt_crypto_kek_t *kek = NULL;
  if ((err = lt_crypto_kek_from_env(&kek, errstr, errstr_size))) return err;
  lt_crypto_kek_destroy(kek);
  return LT_OK;
}

/* Kafka: the one mock cluster of the process, with the topics before any client names them
 * (the mock would auto-create a named topic with its default partition count); then the
 * environment the roles and executors read. */
static lt_err_t start_mock(const lt_embedded_conf_t *c, lt_embedded_t *e, const char *store, char *errstr,
                           size_t errstr_size) {
  /* The mock cluster speaks no SASL: a stack's credentials in the environment must not reach
   * the roles or executors (nor would they mean anything to the mock). */
  unsetenv("LATHE_KAFKA_CONFIG");
  unsetenv("LATHE_KAFKA_CONFIG_DIR");
  lt_bus_conf_t *bus = lt_bus_conf_new();
  if (!bus) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  lt_err_t err = lt_bus_conf_from_env(bus, errstr, errstr_size);
  if (!err) {
    snprintf(e->prefix, sizeof e->prefix, "%s", lt_bus_conf_get(bus, "lathe.topic.prefix"));
    err = lt_bus_mock_new(c->brokers, &e->mock, errstr, errstr_size);
  }
  if (!err) err = lt_bus_mock_create_from_file(e->mock, bus, c->topics_file, NULL, errstr, errstr_size);
  if (!err && (setenv("LATHE_KAFKA_BOOTSTRAP", lt_bus_mock_bootstraps(e->mock), 1) != 0 ||
               setenv("LATHE_STORE_DIR", store, 1) != 0))
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "setenv: %s", strerror(errno));
  lt_bus_conf_destroy(bus);
  return err;
}

lt_err_t lt_embedded_start(const lt_embedded_conf_t *conf, lt_embedded_t **out, char *errstr,
                           size_t errstr_size) {
  lt_embedded_conf_t c = conf ? *conf : (lt_embedded_conf_t){0};
  if (!c.data_dir || !*c.data_dir) c.data_dir = DEFAULT_DIR;
  if (!c.brokers) c.brokers = 1;
  if (!c.topics_file || !*c.topics_file) c.topics_file = getenv("LATHE_TOPICS_FILE");
  if (c.topics_file && !*c.topics_file) c.topics_file = NULL; /* NULL: the built-in copy */
  lt_embedded_t *e = calloc(1, sizeof *e);
  if (!e) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  char store[PATH_MAX + 8];
  lt_err_t err = make_dirs(c.data_dir, e, store, sizeof store, errstr, errstr_size);
  if (!err) err = prepare_master_key(e, errstr, errstr_size);
  if (!err) err = start_mock(&c, e, store, errstr, errstr_size);
  if (err) {
    lt_bus_mock_destroy(e->mock);
    free(e);
    return err;
  }
  *out = e;
  return LT_OK;
}

const char *lt_embedded_bootstrap(const lt_embedded_t *e) { return lt_bus_mock_bootstraps(e->mock); }

const char *lt_embedded_dir(const lt_embedded_t *e) { return e->dir; }

/* Single-quoted for the shell. */
static void put_quoted(FILE *f, const char *s) {
  fputc('\'', f);
  for (; *s; s++) {
    if (*s == '\'') fputs("'\\''", f);
    else fputc(*s, f);
  }
  fputc('\'', f);
}

static void put_env(FILE *f, const lt_embedded_t *e, const char *api_url) {
  fprintf(f, "# lathed --role all --embedded (pid %ld): in memory, valid while that process runs.\n",
          (long)getpid());
  const char *names[] = {"LATHE_KAFKA_BOOTSTRAP", "LATHE_TOPIC_PREFIX", "LATHE_MASTER_KEY_FILE", "LATHE_API_URL"};
  const char *values[] = {lt_embedded_bootstrap(e), e->prefix, e->key_file[0] ? e->key_file : NULL, api_url};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (!values[i]) continue;
    fprintf(f, "export %s=", names[i]);
    put_quoted(f, values[i]);
    fputc('\n', f);
  }
  fprintf(f, "unset LATHE_KAFKA_CONFIG LATHE_KAFKA_CONFIG_DIR  # the mock cluster has no SASL\n");
  if (!e->key_file[0]) fprintf(f, "# the master key: LATHE_MASTER_KEY, as lathed was given it (not written here)\n");
}

lt_err_t lt_embedded_write_env(lt_embedded_t *e, const char *api_url, FILE *out, char *errstr,
                               size_t errstr_size) {
  char tmp[PATH_MAX + 16];
  snprintf(tmp, sizeof tmp, "%s.tmp", e->env_path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    if (fd >= 0) close(fd);
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
  }
  put_env(f, e, api_url);
  bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, e->env_path) != 0) {
    lt_err_t err = lt_errf(errstr, errstr_size, LT_ERR_IO, "cannot write %s: %s", e->env_path, strerror(errno));
    unlink(tmp);
    return err;
  }
  if (out) {
    put_env(out, e, api_url);
    fflush(out);
  }
  return LT_OK;
}

void lt_embedded_stop(lt_embedded_t *e) {
  if (!e) return;
  unlink(e->env_path); /* its bootstrap dies with the cluster */
  lt_bus_mock_destroy(e->mock);
  free(e);
}
