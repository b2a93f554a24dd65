/* lt_dataset_sweep: datasets that never came to exist, swept from the store.
 *
 * A dataset is three objects (lt_dataset.h: data, wrapped key, meta) and exists once its meta is
 * written, last. An API process that dies between its data and its meta (or a delete that dies
 * between its key and its meta) leaves a dataset's objects that no route lists or serves, that
 * count against the tenant's storage quota (lt_api_quota.c) and that nothing else would delete.
 * The publisher's periodic garbage collection calls this for each tenant: a dataset directory
 * missing any of the three, every object of it older than the grace period, loses them all, meta
 * first. A young one is kept: an upload may be completing. Other names under a dataset are
 * left alone. */
#ifndef LT_DATASET_SWEEP_H
#define LT_DATASET_SWEEP_H

#include <stdint.h>

#include "lt_err.h"
#include "lt_store.h"

/* Sweeps tenants/<tenant>/datasets/ of store as of now_ms (wall clock) with grace_ms: *deleted
 * objects deleted, *kept those of incomplete datasets kept for their youth (both may be NULL). */
lt_err_t lt_dataset_sweep(lt_store_t *store, const char *tenant, int64_t now_ms, int64_t grace_ms, uint64_t *deleted,
                          uint64_t *kept, char *errstr, size_t n);

#endif
