/* lt_scheduler_fold: lt_proj with a reorder buffer for control records that arrive before their
 * job's JobSubmitted (see lt_scheduler.h), and the watermark helper replay needs. */
#include <stdlib.h>
#include <string.h>

#include "lt_scheduler.h"

/* The reorder buffer lives in lt_proj (lt_proj_fold), shared by every consumer of the fold. */
struct lt_scheduler_fold {
  lt_proj_t *proj;
};

lt_err_t lt_scheduler_fold_new(const lt_avro_registry_t *reg, size_t max_orphans,
                               lt_scheduler_fold_t **out, char *errstr, size_t n) {
  (void)max_orphans;
  lt_scheduler_fold_t *f = calloc(1, sizeof *f);
  if (!f) return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
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
  lt_proj_destroy(f->proj);
  free(f);
}

lt_proj_t *lt_scheduler_fold_proj(lt_scheduler_fold_t *f) { return f->proj; }

size_t lt_scheduler_fold_orphans(const lt_scheduler_fold_t *f, uint64_t *dropped) {
  return lt_proj_orphans(f->proj, dropped);
}

lt_err_t lt_scheduler_fold_apply(lt_scheduler_fold_t *f, const void *buf, size_t len,
                                 lt_scheduler_fold_cb *cb, void *ctx, char *errstr, size_t n) {
  return lt_proj_fold(f->proj, buf, len, cb, ctx, errstr, n);
}

lt_err_t lt_scheduler_high_watermarks(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n,
                                      int timeout_ms, char *errstr, size_t errstr_size) {
  return lt_bus_consumer_watermarks(c, parts, n, NULL, timeout_ms, errstr, errstr_size);
}
