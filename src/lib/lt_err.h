/* lt_err: the one error type of Lathe.
 *
 * Every fallible function returns lt_err_t (0 is success). Functions that can say more take
 * `char *errstr, size_t errstr_size` (librdkafka's convention) and write one line there that
 * names the field, line, limit or object and says what to do. errstr may be NULL. */
#ifndef LT_ERR_H
#define LT_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" { /* kernels/ include it from CUDA C++ */
#endif

typedef enum lt_err {
  LT_OK = 0,
  LT_ERR_INVALID,        /* bad input from a caller or customer: fix the input */
  LT_ERR_NOMEM,          /* allocation failed */
  LT_ERR_IO,             /* file or socket I/O failed */
  LT_ERR_NOT_FOUND,      /* no such object, record, job, tenant (also: another tenant's) */
  LT_ERR_EXISTS,         /* already exists with different content */
  LT_ERR_UNSUPPORTED,    /* well-formed but not supported (dtype, schema version, feature) */
  LT_ERR_CORRUPT,        /* checksum, authentication tag or framing does not verify */
  LT_ERR_UNKNOWN_SCHEMA, /* an Avro fingerprint no schema in schemas/ has */
  LT_ERR_TIMEOUT,        /* a deadline passed */
  LT_ERR_RETRIABLE,      /* transient failure: the same call may succeed later */
  LT_ERR_FATAL,          /* the handle is unusable: destroy and recreate it */
  LT_ERR_FENCED,         /* a newer attempt or producer owns this: stop */
  LT_ERR_QUOTA,          /* over a tenant quota: the message names the limit */
  LT_ERR_AUTH,           /* not authenticated or not authorised */
  LT_ERR_CANCELLED,      /* stopped on request */
  LT_ERR_UNAVAILABLE,    /* a dependency (broker, object store, GPU) is not there */
  LT_ERR_INTERNAL,       /* a bug: an invariant failed */
  LT_ERR__COUNT
} lt_err_t;

/* Short stable name of an error ("LT_ERR_INVALID"); never NULL. */
const char *lt_err_name(lt_err_t err);

/* Human sentence for an error ("invalid input"); never NULL. */
const char *lt_err_str(lt_err_t err);

/* printf into errstr if it is not NULL and returns err, so a failure site is one line:
 *   return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "line %d: field \"prompt\" is empty", n);
 */
lt_err_t lt_errf(char *errstr, size_t errstr_size, lt_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif

#endif
