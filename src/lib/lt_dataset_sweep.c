/* lt_dataset_sweep: datasets that never came to exist, swept (see lt_dataset_sweep.h). */
#include "lt_dataset_sweep.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_dataset.h"

static const char *const leaves[3] = {LT_DATASET_META, LT_DATASET_KEY, LT_DATASET_DATA}; /* deleted in this order */

typedef struct {
  const lt_dataset_sweep_conf_t *conf;
  const char *tenant;
  size_t plen;        /* of "tenants/<tenant>/datasets/" */
  /* the dataset being listed: its objects come one after another */
  char id[256];
  char keys[3][LT_STORE_KEY_MAX + 1]; /* by leaves[] index; "" when absent */
  bool young;
  /* whole datasets to delete once the page is listed */
  char (*doomed)[LT_STORE_KEY_MAX + 1];
  size_t ndoomed, cap;
  uint64_t kept;
  bool nomem;
} sweep_t;

/* The dataset listed last is complete, young, suspect (found incomplete for the first time), or
 * doomed. */
static void group_end(sweep_t *s) {
  int have = 0;
  for (int i = 0; i < 3; i++) have += s->keys[i][0] != '\0';
  char skey[512];
  snprintf(skey, sizeof skey, "%s/%s", s->tenant, s->id);
  uint64_t since = (uint64_t)(uintptr_t)lt_map_get(s->conf->suspects, skey);
  if (have > 0 && have < 3 && !s->young && !since) { /* suspect until the next sweep */
    if (lt_map_set(s->conf->suspects, skey, (void *)(uintptr_t)s->conf->pass)) s->nomem = true;
    s->kept += (uint64_t)have;
  } else if (have > 0 && have < 3 && !s->young && since < s->conf->pass) { /* doomed */
    lt_map_del(s->conf->suspects, skey);
    for (int i = 0; i < 3; i++) {
      if (!s->keys[i][0]) continue;
      if (s->ndoomed == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        void *grown = realloc(s->doomed, cap * sizeof *s->doomed);
        if (!grown) {
          s->nomem = true;
          break;
        }
        s->doomed = grown;
        s->cap = cap;
      }
      memcpy(s->doomed[s->ndoomed++], s->keys[i], sizeof s->keys[i]);
    }
  } else {
    if (have > 0 && have < 3) s->kept += (uint64_t)have; /* young */
    if (since && since < s->conf->pass) lt_map_del(s->conf->suspects, skey); /* whole, or young again */
  }
  s->id[0] = '\0';
  memset(s->keys, 0, sizeof s->keys);
  s->young = false;
}

static lt_err_t visit(void *ctx, const char *key, const lt_store_info_t *info) {
  sweep_t *s = ctx;
  const char *id = key + s->plen, *slash = strchr(id, '/');
  size_t idlen = slash ? (size_t)(slash - id) : 0;
  if (!idlen || idlen >= sizeof s->id) return LT_OK; /* not a dataset's object */
  if (strlen(s->id) != idlen || strncmp(s->id, id, idlen) != 0) { /* the next dataset */
    group_end(s);
    memcpy(s->id, id, idlen);
    s->id[idlen] = '\0';
  }
  for (int i = 0; i < 3; i++)
    if (strcmp(slash + 1, leaves[i]) == 0) snprintf(s->keys[i], sizeof s->keys[i], "%s", key);
  if (s->conf->now_ms - info->mtime * 1000 < s->conf->grace_ms) s->young = true;
  return LT_OK;
}

/* Deletes what the pages so far doomed, meta first within each dataset. */
static lt_err_t delete_doomed(lt_store_t *store, sweep_t *s, uint64_t *deleted, char *errstr, size_t n) {
  lt_err_t err = LT_OK;
  for (size_t i = 0; i < s->ndoomed && !err; i++)
    if (!(err = lt_store_delete(store, s->doomed[i], errstr, n))) (*deleted)++;
  s->ndoomed = 0;
  return err;
}

void lt_dataset_sweep_forget(lt_map_t *suspects, uint64_t pass) {
  lt_map_iter_t it = {0};
  while (lt_map_next(suspects, &it))
    if ((uint64_t)(uintptr_t)it.value < pass) lt_map_del(suspects, it.key);
}

lt_err_t lt_dataset_sweep(lt_store_t *store, const char *tenant, const lt_dataset_sweep_conf_t *conf,
                          uint64_t *deleted, uint64_t *kept, char *errstr, size_t n) {
  char prefix[LT_STORE_KEY_MAX + 1], after[LT_STORE_KEY_MAX + 1] = "", next[LT_STORE_KEY_MAX + 1] = "";
  uint64_t count = 0;
  if (conf->pass == 0) return lt_errf(errstr, n, LT_ERR_INVALID, "dataset sweep: pass numbers start at 1");
  sweep_t *s = calloc(1, sizeof *s);
  if (!s) return lt_errf(errstr, n, LT_ERR_NOMEM, "dataset sweep: out of memory");
  snprintf(prefix, sizeof prefix, "tenants/%s/datasets/", tenant);
  s->conf = conf;
  s->tenant = tenant;
  s->plen = strlen(prefix);
  lt_err_t err;
  do {
    err = lt_store_list(store, prefix, after, conf->page, visit, s, next, sizeof next, errstr, n);
    if (!err && !next[0]) group_end(s); /* the last dataset listed */
    if (!err && s->nomem) err = lt_errf(errstr, n, LT_ERR_NOMEM, "dataset sweep: out of memory");
    if (!err) err = delete_doomed(store, s, &count, errstr, n);
    snprintf(after, sizeof after, "%s", next);
  } while (!err && next[0]);
  if (deleted) *deleted = count;
  if (kept) *kept = s->kept;
  free(s->doomed);
  free(s);
  return err;
}
