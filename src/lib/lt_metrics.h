/* lt_metrics: Prometheus metrics in the text exposition format (version 0.0.4), and the small
 * operator HTTP endpoint (/healthz, /metrics) of the roles that have no server of their own.
 *
 * Every role's /metrics is written through this, so each family has exactly one HELP and one
 * TYPE line before its samples, names follow Prometheus's rules (base units: seconds and bytes;
 * counters end in _total) and histograms have cumulative _bucket{le} lines ending in +Inf with
 * _sum and _count — what `promtool check metrics` (tests/operations_python.py) accepts.
 *
 * A text is written family by family: lt_metrics_family() opens one, the samples after it
 * belong to it. Nothing here locks: the caller renders from its own thread (the roles render on
 * their event loop, or copy their counters under their own lock first). */
#ifndef LT_METRICS_H
#define LT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

struct event_base;

typedef enum { LT_METRIC_COUNTER, LT_METRIC_GAUGE, LT_METRIC_HISTOGRAM } lt_metric_type_t;

/* A label: a list of them ends with {NULL, NULL}. Values are escaped when written. */
typedef struct lt_metric_label {
  const char *name, *value;
} lt_metric_label_t;

/* A text being written. */
typedef struct lt_metrics lt_metrics_t;

/* An empty text; NULL when out of memory (every call below then does nothing). */
lt_metrics_t *lt_metrics_new(void);

/* Opens family name with its type and help (one line, no newline). */
void lt_metrics_family(lt_metrics_t *m, const char *name, lt_metric_type_t type, const char *help);

/* A sample of the open counter or gauge; labels may be NULL. */
void lt_metrics_sample(lt_metrics_t *m, const lt_metric_label_t *labels, double value);

/* A family with one unlabelled sample: the common case of a role's own counters. */
void lt_metrics_one(lt_metrics_t *m, const char *name, lt_metric_type_t type, const char *help, double value);

/* A histogram's counts, per bucket and not cumulative: le[b] counts observations v with
 * bounds[b-1] < v <= bounds[b], and le[nbounds] those above the last bound. bounds ascend and
 * exclude +Inf. Updated by its owner's thread only. */
#define LT_METRICS_BUCKETS_MAX 16
typedef struct lt_metrics_hist {
  const double *bounds;
  int nbounds;
  uint64_t le[LT_METRICS_BUCKETS_MAX + 1];
  uint64_t count;
  double sum;
} lt_metrics_hist_t;

/* An empty histogram over bounds (borrowed: a static table), at most LT_METRICS_BUCKETS_MAX. */
void lt_metrics_hist_init(lt_metrics_hist_t *h, const double *bounds, int nbounds);
void lt_metrics_hist_observe(lt_metrics_hist_t *h, double v);

/* The open histogram's samples for one label set: _bucket lines (cumulative, then +Inf), _sum
 * and _count. */
void lt_metrics_hist(lt_metrics_t *m, const lt_metric_label_t *labels, const lt_metrics_hist_t *h);

/* The same from counts kept elsewhere: cumulative[b] observations <= bounds[b] for b < n, and
 * count in all (the +Inf bucket). */
void lt_metrics_buckets(lt_metrics_t *m, const lt_metric_label_t *labels, const double *bounds,
                        const uint64_t *cumulative, int n, double sum, uint64_t count);

/* The text, NUL-terminated and owned by the caller (free), *len its length; m is freed. NULL
 * when out of memory at any point. */
char *lt_metrics_text(lt_metrics_t *m, size_t *len);

/* ---------------------------------------------------------------- the operator endpoint */

/* A role's Prometheus text (malloc'd; NULL: out of memory), written on the loop's thread. */
typedef char *(*lt_metrics_render_fn)(void *ctx);

/* A role's /healthz: its HTTP status (200 ready, 503 not yet) and a JSON object (malloc'd). */
typedef int (*lt_metrics_health_fn)(void *ctx, char **json);

typedef struct lt_metrics_server lt_metrics_server_t;

/* Serves GET /metrics and /healthz (404 for anything else; plain HTTP without authentication:
 * bind it to loopback) on addr:port of base; port 0 is any free port. ctx is passed to both
 * functions and must outlive the server. */
lt_err_t lt_metrics_server_new(struct event_base *base, const char *addr, uint16_t port,
                               lt_metrics_render_fn render, lt_metrics_health_fn health, void *ctx,
                               lt_metrics_server_t **out, char *errstr, size_t errstr_size);

/* The port it listens on (the one chosen for port 0). */
uint16_t lt_metrics_server_port(const lt_metrics_server_t *s);

/* NULL is fine. Stop it before what ctx points to goes. */
void lt_metrics_server_destroy(lt_metrics_server_t *s);

#endif
