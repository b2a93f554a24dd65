/* lt_dataset_sweep: datasets that never came to exist, swept from the store.
 *
 * A dataset is three objects (lt_dataset.h: data, wrapped key, meta) and exists once its meta is
 * written, last. An API process that dies between its data and its meta (or a delete that dies
 * between its key and its meta) leaves a dataset's objects that no route lists or serves, that
 * count against the tenant's storage quota (lt_api_quota.c) and that nothing else would delete.
 * The publisher's periodic garbage collection calls this for each tenant: a dataset directory
 * missing any of the three, every object of it older than the grace period, and found so by the
 * sweep before this one too, loses them all, meta first. A young one is kept: an upload may be
 * completing. The second sweep is there because the store may date a multipart object by the
 * start of its upload: an upload that took longer than the grace period commits data that looks
 * old already, and a listing in the moment before its key and meta are written would find it
 * incomplete; a sweep later (the GC's interval) finds it whole. Other names under a dataset
 * are left alone. */
#ifndef LT_DATASET_SWEEP_H
#define LT_DATASET_SWEEP_H

#include <stdint.h>

#include "lt_err.h"
#include "lt_map.h"
#include "lt_store.h"

/* One sweep's settings. suspects is the caller's, kept from one sweep to the next: "tenant/dataset"
 * -> the number of the sweep that first found the dataset incomplete and old; pass numbers this
 * sweep (greater than the last's). page: keys listed at a time (0: the store's most). */
typedef struct lt_dataset_sweep_conf {
  int64_t now_ms;   /* wall clock */
  int64_t grace_ms; /* objects younger than this are kept */
  lt_map_t *suspects;
  uint64_t pass;
  size_t page;
} lt_dataset_sweep_conf_t;

/* Sweeps tenants/<tenant>/datasets/ of store: *deleted objects deleted, *kept those of incomplete
 * datasets kept for now (young, or found incomplete for the first time); both may be NULL. */
lt_err_t lt_dataset_sweep(lt_store_t *store, const char *tenant, const lt_dataset_sweep_conf_t *conf,
                          uint64_t *deleted, uint64_t *kept, char *errstr, size_t n);

/* After every tenant was swept in pass pass without error: forgets the suspects no sweep of that
 * pass met again (deleted meanwhile, or of a tenant no longer listed). */
void lt_dataset_sweep_forget(lt_map_t *suspects, uint64_t pass);

#endif
