/* lt_conf: lathed's configuration from a file and from flags, beside the environment.
 *
 * Every setting is a LATHE_ environment variable (lathed --help lists them) or a librdkafka
 * property. A configuration file holds one NAME=VALUE per line ('#' comments and blank lines
 * ignored; the value is the rest of the line, spaces around it trimmed):
 *
 *   LATHE_KAFKA_BOOTSTRAP=kafka-1:9093,kafka-2:9093
 *   kafka.socket.timeout.ms=30000          any librdkafka property, passed through
 *
 * Precedence: a flag (--set NAME=VALUE) over the environment over the file. kafka.* settings
 * are gathered, in order, into LATHE_KAFKA_PROPERTIES (newline-separated name=value), which
 * lt_bus_conf_from_env applies after the LATHE_KAFKA_CONFIG file. */
#ifndef LT_CONF_H
#define LT_CONF_H

#include <stdbool.h>
#include <stddef.h>

#include "lt_err.h"

/* Applies one NAME=VALUE (from a file when override is false, from a flag when true): a LATHE_
 * name is set in the environment (a file's only when the environment has none), a kafka.NAME is
 * appended to LATHE_KAFKA_PROPERTIES. LT_ERR_INVALID names what is wrong: no '=', a name that is
 * neither, a LATHE_ name no part of Lathe reads (with the nearest known one: a typo). where prefixes the message ("lathed.conf:3"). */
lt_err_t lt_conf_apply(const char *line, bool override, const char *where, char *errstr, size_t errstr_size);

/* Whether name is a LATHE_ setting some part of Lathe reads (a file or flag naming another is
 * refused by lt_conf_apply, with the nearest known name); lt_conf_name: the i-th of them, NULL past
 * the last. */
bool lt_conf_known(const char *name);
const char *lt_conf_name(size_t i);
/* The known setting nearest name, or NULL when none is within max_edits insertions, deletions
 * or substitutions. */
const char *lt_conf_nearest(const char *name, size_t max_edits);

/* Applies every line of the file at path. LT_ERR_IO when it cannot be read; the first bad line's
 * error otherwise (nothing after it applied). */
lt_err_t lt_conf_load_file(const char *path, char *errstr, size_t errstr_size);

/* Takes --config FILE and --set NAME=VALUE out of argv (wherever they are; *argc shrinks), files
 * first, then flags. Returns LT_OK, or the first error. */
lt_err_t lt_conf_from_args(int *argc, char **argv, char *errstr, size_t errstr_size);

#endif
