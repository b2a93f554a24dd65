/* lt_conf: configuration from a file and flags (lt_conf.h). */
#include "lt_conf.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
