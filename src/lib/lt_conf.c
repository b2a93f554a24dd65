/* lt_conf: configuration from a file and flags (lt_conf.h). */
#include "lt_conf.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every LATHE_ setting a part of Lathe reads, sorted (test_conf keeps it equal to the "LATHE_..."
 * names in src/ and workers/): a file or a flag naming another is a mistake, said as one. */
static const char *const known[] = {
    "LATHE_ACCESS_SECOND_STAFF", "LATHE_ACLS_FILE", "LATHE_API_AUTH_FAIL_RATE", "LATHE_API_CA_FILE",
    "LATHE_API_DOWNLOAD_WINDOW", "LATHE_API_KEY", "LATHE_API_KEY_RATE", "LATHE_API_MAX_DOWNLOADS",
    "LATHE_API_MAX_OPEN_UPLOADS", "LATHE_API_MAX_SAVING_CALLS", "LATHE_API_MAX_STORAGE_BYTES",
    "LATHE_API_SSE_HISTORY", "LATHE_API_SSE_KEEP_ENDED_MS", "LATHE_API_STREAM_BACKLOG", "LATHE_API_TENANT_RATE",
    "LATHE_API_THREADS", "LATHE_API_UPLOAD_IDLE_MS", "LATHE_API_URL", "LATHE_CUDA_PRECISION",
    "LATHE_EXECUTOR_CONFINE", "LATHE_EXECUTOR_DATA_MB", "LATHE_EXECUTOR_NOFILE", "LATHE_EXECUTOR_NPROC",
    "LATHE_EXECUTOR_USER", "LATHE_GC_GRACE_MS", "LATHE_INSTANCE", "LATHE_KAFKA_BOOTSTRAP", "LATHE_KAFKA_CLIENT_ID",
    "LATHE_KAFKA_CONFIG", "LATHE_KAFKA_CONFIG_DIR", "LATHE_KAFKA_PROPERTIES", "LATHE_KEEP_CHECKPOINTS",
    "LATHE_KILL_DEADLINE_MS", "LATHE_LEASE_MARGIN_MS", "LATHE_LEASE_MS", "LATHE_LOG_FORMAT", "LATHE_MASTER_KEY",
    "LATHE_MASTER_KEY_FILE", "LATHE_MASTER_KEY_ID", "LATHE_MAX_UNAVAILABLE_STOPS", "LATHE_MODELS_DIR",
    "LATHE_PREEMPT_AFTER_S", "LATHE_PUBLISHER_LOG_COMMITS", "LATHE_S3_ACCESS_KEY", "LATHE_S3_BUCKET",
    "LATHE_S3_ENDPOINT", "LATHE_S3_SECRET_KEY", "LATHE_SAMPLER_ADAPTER_MB", "LATHE_SAMPLER_CUDA",
    "LATHE_SAMPLER_KV_MB", "LATHE_SAMPLER_MAX_RUNNING", "LATHE_SAMPLER_PRECISION", "LATHE_SAMPLER_PREFILL_CHUNK",
    "LATHE_SAMPLER_QUEUE_PER_TENANT", "LATHE_SAMPLER_QUEUE_TOTAL", "LATHE_SAMPLER_THREADS", "LATHE_SCHEDULER_PORT",
    "LATHE_SCHEDULER_URL", "LATHE_SESSION_IDLE_MS", "LATHE_STAFF_KEY", "LATHE_STAFF_KEYS_FILE",
    "LATHE_START_TIMEOUT_MS", "LATHE_STORE_DIR", "LATHE_TOKENIZER", "LATHE_TOPICS_FILE", "LATHE_TOPIC_PREFIX",
    "LATHE_WORKER_BACKEND", "LATHE_WORKER_EXECUTOR", "LATHE_WORKER_MEM_DIR", "LATHE_WORKER_NODE_GROUP",
    "LATHE_WORKER_RENDEZVOUS", "LATHE_WORKER_SLOTS", "LATHE_WORKER_STORE_RETRY_MS", "LATHE_WORKER_THREADS",
};

bool lt_conf_known(const char *name) {
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (strcmp(known[i], name) == 0) return true;
  return false;
}

const char *lt_conf_name(size_t i) { return i < sizeof known / sizeof *known ? known[i] : NULL; }

/* Edit distance (insertions, deletions, substitutions) of a and b, both under 128 bytes. */
static size_t distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), row[128];
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      diag = up;
      row[j] = best;
    }
  }
  return row[lb];
}

const char *lt_conf_nearest(const char *name, size_t max_edits) {
  const char *best = NULL;
  size_t d = max_edits + 1;
  for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
    if (strlen(known[i]) >= 128) continue;
    size_t k = distance(name, known[i]);
    if (k < d) d = k, best = known[i];
  }
  return best;
}

static bool lathe_name(const char *s, size_t n) {
  if (n <= 6 || strncmp(s, "LATHE_", 6) != 0) return false;
  for (size_t i = 6; i < n; i++)
    if (!(isupper((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '_')) return false;
  return true;
}

static bool kafka_name(const char *s, size_t n) {
  if (n <= 6 || strncmp(s, "kafka.", 6) != 0) return false;
  for (size_t i = 6; i < n; i++)
    if (!(islower((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '.' || s[i] == '_')) return false;
  return true;
}

static lt_err_t append_kafka(const char *name, size_t nlen, const char *value, char *errstr, size_t n) {
  const char *old = getenv("LATHE_KAFKA_PROPERTIES");
  size_t len = (old ? strlen(old) + 1 : 0) + nlen + 1 + strlen(value) + 1;
  char *v = malloc(len);
  if (!v) return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  snprintf(v, len, "%s%s%.*s=%s", old ? old : "", old && *old ? "\n" : "", (int)nlen, name, value);
  int rc = setenv("LATHE_KAFKA_PROPERTIES", v, 1);
  free(v);
  return rc ? lt_errf(errstr, n, LT_ERR_NOMEM, "setenv: %s", strerror(errno)) : LT_OK;
}

lt_err_t lt_conf_apply(const char *line, bool override, const char *where, char *errstr, size_t n) {
  while (isspace((unsigned char)*line)) line++;
  const char *eq = strchr(line, '=');
  if (!eq) return lt_errf(errstr, n, LT_ERR_INVALID, "%s: \"%.60s\" is not NAME=VALUE", where, line);
  size_t nlen = (size_t)(eq - line);
  while (nlen && isspace((unsigned char)line[nlen - 1])) nlen--;
  const char *value = eq + 1;
  while (isspace((unsigned char)*value)) value++;
  char v[4096];
  size_t vlen = strlen(value);
  while (vlen && isspace((unsigned char)value[vlen - 1])) vlen--;
  if (vlen >= sizeof v) return lt_errf(errstr, n, LT_ERR_INVALID, "%s: the value is over %zu bytes", where, sizeof v - 1);
  memcpy(v, value, vlen);
  v[vlen] = '\0';
  if (kafka_name(line, nlen)) {
    if (!vlen) return lt_errf(errstr, n, LT_ERR_INVALID, "%s: %.*s has no value", where, (int)nlen, line);
    return append_kafka(line + 6, nlen - 6, v, errstr, n);
  }
  if (!lathe_name(line, nlen))
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "%s: \"%.*s\" is neither a LATHE_ setting (lathed --help lists them) nor kafka.PROPERTY", where,
                   (int)(nlen > 60 ? 60 : nlen), line);
  char name[128];
  if (nlen >= sizeof name) return lt_errf(errstr, n, LT_ERR_INVALID, "%s: the name is too long", where);
  memcpy(name, line, nlen);
  name[nlen] = '\0';
  if (!lt_conf_known(name)) {
    const char *near = lt_conf_nearest(name, 3); /* a typo, not another word */
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s: %s is no setting Lathe reads%s%s%s", where, name,
                   near ? " (did you mean " : "; lathed --help lists every one", near ? near : "", near ? "?)" : "");
  }
  if (!override && getenv(name)) return LT_OK; /* the environment wins over a file */
  if (setenv(name, v, 1)) return lt_errf(errstr, n, LT_ERR_NOMEM, "setenv: %s", strerror(errno));
  return LT_OK;
}

lt_err_t lt_conf_load_file(const char *path, char *errstr, size_t n) {
  FILE *f = fopen(path, "r");
  if (!f) return lt_errf(errstr, n, LT_ERR_IO, "configuration file %s: %s", path, strerror(errno));
  char line[8192], where[4200];
  lt_err_t err = LT_OK;
  for (int no = 1; !err && fgets(line, sizeof line, f); no++) {
    size_t len = strlen(line);
    snprintf(where, sizeof where, "%s:%d", path, no);
    if (len == sizeof line - 1 && line[len - 1] != '\n') {
      err = lt_errf(errstr, n, LT_ERR_INVALID, "%s: the line is over %zu bytes", where, sizeof line - 2);
      break;
    }
    line[strcspn(line, "\r\n")] = '\0';
    const char *s = line;
    while (isspace((unsigned char)*s)) s++;
    if (*s == '\0' || *s == '#') continue;
    err = lt_conf_apply(s, false, where, errstr, n);
  }
  if (!err && ferror(f)) err = lt_errf(errstr, n, LT_ERR_IO, "configuration file %s: read error", path);
  fclose(f);
  return err;
}

lt_err_t lt_conf_from_args(int *argc, char **argv, char *errstr, size_t n) {
  /* Files first, so that every --set wins over every file whatever the order on the line. */
  for (int pass = 0; pass < 2; pass++) {
    int out = 1;
    for (int i = 1; i < *argc; i++) {
      const char *a = argv[i];
      bool cfg = strcmp(a, "--config") == 0 || strncmp(a, "--config=", 9) == 0;
      bool set = strcmp(a, "--set") == 0 || strncmp(a, "--set=", 6) == 0;
      if (!cfg && !set) {
        argv[out++] = argv[i];
        continue;
      }
      const char *v = strchr(a, '=');
      if (v) v++;
      else if (i + 1 < *argc) v = argv[++i];
      else return lt_errf(errstr, n, LT_ERR_INVALID, "%s needs a value", a);
      lt_err_t err = LT_OK;
      if (cfg && pass == 0) err = lt_conf_load_file(v, errstr, n);
      if (set && pass == 1) err = lt_conf_apply(v, true, "--set", errstr, n);
      if (err) return err;
      if (pass == 0) { /* keep them for the second pass */
        argv[out++] = (char *)a;
        if (!strchr(a, '=')) argv[out++] = (char *)v;
      }
    }
    *argc = out;
    argv[out] = NULL;
  }
  return LT_OK;
}
