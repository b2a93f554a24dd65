/* lt_err: names and sentences for lt_err_t. */
#include "lt_err.h"

#include <stdarg.h>
#include <stdio.h>

static const struct {
  const char *name;
  const char *str;
} lt_err_table[LT_ERR__COUNT] = {
    [LT_OK] = {"LT_OK", "success"},
    [LT_ERR_INVALID] = {"LT_ERR_INVALID", "invalid input"},
    [LT_ERR_NOMEM] = {"LT_ERR_NOMEM", "out of memory"},
    [LT_ERR_IO] = {"LT_ERR_IO", "I/O error"},
    [LT_ERR_NOT_FOUND] = {"LT_ERR_NOT_FOUND", "not found"},
    [LT_ERR_EXISTS] = {"LT_ERR_EXISTS", "already exists"},
    [LT_ERR_UNSUPPORTED] = {"LT_ERR_UNSUPPORTED", "not supported"},
    [LT_ERR_CORRUPT] = {"LT_ERR_CORRUPT", "data is corrupt or was tampered with"},
    [LT_ERR_UNKNOWN_SCHEMA] = {"LT_ERR_UNKNOWN_SCHEMA", "unknown Avro schema fingerprint"},
    [LT_ERR_TIMEOUT] = {"LT_ERR_TIMEOUT", "timed out"},
    [LT_ERR_RETRIABLE] = {"LT_ERR_RETRIABLE", "temporary failure, retry"},
    [LT_ERR_FATAL] = {"LT_ERR_FATAL", "fatal error, handle must be recreated"},
    [LT_ERR_FENCED] = {"LT_ERR_FENCED", "fenced by a newer owner"},
    [LT_ERR_QUOTA] = {"LT_ERR_QUOTA", "over quota"},
    [LT_ERR_AUTH] = {"LT_ERR_AUTH", "not authorised"},
    [LT_ERR_CANCELLED] = {"LT_ERR_CANCELLED", "cancelled"},
    [LT_ERR_UNAVAILABLE] = {"LT_ERR_UNAVAILABLE", "service unavailable"},
    [LT_ERR_INTERNAL] = {"LT_ERR_INTERNAL", "internal error (a bug)"},
};

const char *lt_err_name(lt_err_t err) {
  if ((unsigned)err >= LT_ERR__COUNT) return "LT_ERR_?";
  return lt_err_table[err].name;
}

const char *lt_err_str(lt_err_t err) {
  if ((unsigned)err >= LT_ERR__COUNT) return "unknown error";
  return lt_err_table[err].str;
}

lt_err_t lt_errf(char *errstr, size_t errstr_size, lt_err_t err, const char *fmt, ...) {
  if (errstr && errstr_size > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
  }
  return err;
}
