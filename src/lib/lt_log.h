/* lt_log: the daemons' log lines on stderr, one line per call, as text or as JSON.
 *
 * Text (the default) is what people read in a terminal: "lathed <role>: <msg>". JSON
 * (`lathed --log-format json`, LATHE_LOG_FORMAT=json) is what log shippers parse: one object a
 * line with ts (RFC 3339 UTC, milliseconds), level, role, instance, msg, and the ids the line is
 * about (job, tenant, attempt, session) as fields of their own, so a search by job needs no
 * regular expression over messages. Messages carry ids, sizes and reasons, never customer
 * content (prompts, dataset text): the ids fields are no excuse to put more in msg.
 *
 * Thread-safe: a line is formatted on the caller's stack and written with one write(2), so
 * lines of the api's pool, the upload threads and the loop do not interleave mid-line. */
#ifndef LT_LOG_H
#define LT_LOG_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { LT_LOG_DEBUG, LT_LOG_INFO, LT_LOG_WARN, LT_LOG_ERROR } lt_log_level_t;
typedef enum { LT_LOG_TEXT, LT_LOG_JSON } lt_log_format_t;

/* What a line is about; every member may be NULL (attempt: 0), and is then left out. */
typedef struct lt_log_ids {
  const char *job, *tenant, *session;
  int32_t attempt;
} lt_log_ids_t;

/* Sets the process-wide format, the role lines without one of their own name ("all" for
 * lathed --role all) and this process's instance (LATHE_INSTANCE or the host name). Call once
 * at start-up, before any thread logs; until then lines are text with no instance. The strings
 * are copied. */
void lt_log_setup(lt_log_format_t format, const char *role, const char *instance);

/* "text" or "json" into *out; false for anything else. */
bool lt_log_format_parse(const char *text, lt_log_format_t *out);

/* The format lt_log_setup chose. */
lt_log_format_t lt_log_format(void);

/* Writes one line: role NULL is the process's (lt_log_setup), ids may be NULL. A message longer
 * than 16 KiB is cut there; a newline in it becomes a space (one line stays one line). */
void lt_log(lt_log_level_t level, const char *role, const lt_log_ids_t *ids, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The shorthands most lines use. */
#define lt_log_info(role, ...) lt_log(LT_LOG_INFO, role, NULL, __VA_ARGS__)
#define lt_log_warn(role, ...) lt_log(LT_LOG_WARN, role, NULL, __VA_ARGS__)
#define lt_log_error(role, ...) lt_log(LT_LOG_ERROR, role, NULL, __VA_ARGS__)

/* A job's ids, for the many lines about one job: lt_log(..., LT_LOG_JOB(id), ...). */
#define LT_LOG_JOB(id) (&(lt_log_ids_t){.job = (id)})

#endif
