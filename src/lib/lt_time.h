/* lt_time: Lathe's two clocks, one of each kind.
 *
 * Wall time (CLOCK_REALTIME) is what records carry: the time an event happened, comparable
 * across processes and hosts, and what lease expiry in the log is measured in. Monotonic time
 * (CLOCK_MONOTONIC) measures durations and local deadlines inside one process: it never jumps
 * when the system clock is set. Use wall time only for what goes into a record or is compared
 * with a record's time; everything else is monotonic. Part of lt_base: the engine may use it. */
#ifndef LT_TIME_H
#define LT_TIME_H

#include <stdint.h>
#include <time.h>

/* Milliseconds since the Unix epoch (records' time fields, leases). */
static inline int64_t lt_time_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Microseconds of the monotonic clock (durations, latencies). */
static inline int64_t lt_time_mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Milliseconds of the monotonic clock (local deadlines, timeouts). */
static inline int64_t lt_time_mono_ms(void) { return lt_time_mono_us() / 1000; }

#endif
