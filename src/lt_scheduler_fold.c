/* lt_scheduler_fold: lt_proj with a reorder buffer for control records that arrive before their
 * job's JobSubmitted (see lt_scheduler.h), and the watermark helper replay needs. */
#include <librdkafka/rdkafka.h>
#include <stdlib.h>
#include <string.h>

#include "lt_bus_int.h"
#include "lt_scheduler.h"

typedef struct orphan {
  struct orphan *next;
  char job_id[LT_JOB_ID_MAX];
  size_t len;
  unsigned char bytes[];
} orphan_t;

struct lt_scheduler_fold {
  lt_proj_t *proj;
  orphan_t *head, *tail; /* in arrival order */
  size_t n, max;
  uint64_t dropped;
};

lt_err_t lt_scheduler_fold_new(const lt_avro_registry_t *reg, size_t max_orphans,
                               lt_scheduler_fold_t **out, char *errstr, size_t n) {
  lt_scheduler_fold_t *f = calloc(1, sizeof *f);
  if (!f) return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  f->max = max_orphans ? max_orphans : 100000;
  lt_err_t err = lt_proj_new(reg, &f->proj, errstr, n);
  if (err) {
    free(f);
    return err;
  }
  *out = f;
  return LT_OK;
}

void lt_scheduler_fold_destroy(lt_scheduler_fold_t *f) {
  if (!f) return;
  for (orphan_t *o = f->head, *nx; o; o = nx) {
    nx = o->next;
    free(o);
  }
  lt_proj_destroy(f->proj);
  free(f);
}

lt_proj_t *lt_scheduler_fold_proj(lt_scheduler_fold_t *f) { return f->proj; }

size_t lt_scheduler_fold_orphans(const lt_scheduler_fold_t *f, uint64_t *dropped) {
  if (dropped) *dropped = f->dropped;
  return f->n;
}

static void keep_aside(lt_scheduler_fold_t *f, const char *job_id, const void *buf, size_t len) {
  if (f->n >= f->max || strlen(job_id) >= LT_JOB_ID_MAX) {
    f->dropped++;
    return;
  }
  orphan_t *o = malloc(sizeof *o + len);
  if (!o) {
    f->dropped++;
    return;
  }
  o->next = NULL;
  snprintf(o->job_id, sizeof o->job_id, "%s", job_id);
  o->len = len;
  memcpy(o->bytes, buf, len);
  if (f->tail) f->tail->next = o;
  else f->head = o;
  f->tail = o;
  f->n++;
}

/* Applies, in arrival order, every kept-aside record of job_id. */
static void release(lt_scheduler_fold_t *f, const char *job_id, lt_scheduler_fold_cb *cb, void *ctx) {
  char id[LT_JOB_ID_MAX];
  snprintf(id, sizeof id, "%s", job_id); /* job_id points into a record the applies reuse */
  orphan_t **pp = &f->head, *prev = NULL;
  while (*pp) {
    orphan_t *o = *pp;
    if (strcmp(o->job_id, id) != 0) {
      prev = o;
      pp = &o->next;
      continue;
    }
    *pp = o->next;
    if (f->tail == o) f->tail = prev;
    f->n--;
    lt_proj_result_t res;
    if (lt_proj_apply(f->proj, o->bytes, o->len, &res, NULL, 0) == LT_OK && cb &&
        res.job_outcome == LT_JOB_APPLIED)
      cb(ctx, &res);
    free(o);
  }
}

lt_err_t lt_scheduler_fold_apply(lt_scheduler_fold_t *f, const void *buf, size_t len,
                                 lt_scheduler_fold_cb *cb, void *ctx, char *errstr, size_t n) {
  lt_proj_result_t res;
  lt_err_t err = lt_proj_apply(f->proj, buf, len, &res, errstr, n);
  if (err) return err;
  if (res.job_outcome == LT_JOB_UNKNOWN_JOB && res.record) {
    const char *job_id = NULL;
    if (lt_avro_get_string(res.record, "job_id", &job_id, NULL) == LT_OK && job_id && *job_id)
      keep_aside(f, job_id, buf, len);
    return LT_OK;
  }
  if (cb) cb(ctx, &res);
  if (f->n && res.type && res.job_id && res.job_outcome == LT_JOB_APPLIED &&
      strcmp(res.type, "JobSubmitted") == 0)
    release(f, res.job_id, cb, ctx);
  return LT_OK;
}

lt_err_t lt_scheduler_high_watermarks(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n,
                                      int timeout_ms, char *errstr, size_t errstr_size) {
  rd_kafka_t *rk = lt_bus_consumer_rk(c);
  for (size_t i = 0; i < n; i++) {
    int64_t lo = 0, hi = 0;
    rd_kafka_resp_err_t e =
        rd_kafka_query_watermark_offsets(rk, parts[i].topic, parts[i].partition, &lo, &hi, timeout_ms);
    if (e)
      return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "watermarks of %s[%d]: %s",
                     parts[i].topic, (int)parts[i].partition, rd_kafka_err2str(e));
    parts[i].offset = hi;
  }
  return LT_OK;
}
