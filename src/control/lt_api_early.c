/* lt_api_early: the answers (PrimitiveCompleted) of sessions this API has not folded yet. The feed
 * reads the topics side by side, so an API reading the log back may read a session's answers
 * before its JobSubmitted; they are kept (their bytes) and folded, in the order they came, once
 * the session is (lt_api_sessions_on_job), or dropped a minute after the feed caught up if it
 * never is. LT_API_EARLY_RESULTS_MAX records in all: past it, new ones are dropped (logged). See
 * lt_api_int.h. */
#include "lt_api_int.h"

#include <stdlib.h>
#include <string.h>

#include "lt_log.h"
#include "lt_time.h"

#define LT_API_EARLY_RESULTS_MAX 65536

typedef struct {
  size_t n, cap;
  int64_t at_ms; /* when the first came */
  struct {
    void *bytes;
    size_t len;
  } *v;
} early_t;

static void early_free(void *p) {
  early_t *e = p;
  for (size_t i = 0; i < e->n; i++) free(e->v[i].bytes);
  free(e->v);
  free(e);
}

void lt_api_early_keep(lt_api_t *api, const char *job_id, const void *bytes, size_t len) {
  early_t *e = lt_map_get(api->early_results, job_id);
  if (api->nearly_results >= LT_API_EARLY_RESULTS_MAX) {
    lt_log_warn("api", "session %s: a call's answer read before the session is dropped: %d are kept already", job_id,
                LT_API_EARLY_RESULTS_MAX);
    return;
  }
  if (!e) {
    if (!(e = calloc(1, sizeof *e)) || lt_map_set(api->early_results, job_id, e)) {
      free(e);
      return;
    }
    e->at_ms = lt_time_mono_ms();
  }
  if (e->n == e->cap) {
    size_t cap = e->cap ? 2 * e->cap : 4;
    void *v = realloc(e->v, cap * sizeof *e->v);
    if (!v) return;
    e->v = v;
    e->cap = cap;
  }
  void *copy = malloc(len ? len : 1);
  if (!copy) return;
  memcpy(copy, bytes, len);
  e->v[e->n].bytes = copy;
  e->v[e->n++].len = len;
  api->nearly_results++;
}

void lt_api_early_release(lt_api_t *api, const char *job_id) {
  early_t *e = api->nearly_results ? lt_map_get(api->early_results, job_id) : NULL;
  if (!e) return;
  lt_map_del(api->early_results, job_id); /* the map owns no values: e is still ours */
  api->nearly_results -= e->n;
  for (size_t i = 0; i < e->n; i++) {
    lt_avro_record_t *rec;
    if (lt_avro_decode(api->result_dec, e->v[i].bytes, e->v[i].len, &rec, NULL, 0)) continue;
    lt_proj_result_t res = {.record = rec, .type = lt_avro_record_type(rec), .message = e->v[i].bytes,
                            .message_len = e->v[i].len};
    lt_api_sessions_on_record(api, &res);
    lt_api_events_on_record(api, &res); /* as the feed hands a folded one to the event streams */
  }
  early_free(e);
}

void lt_api_early_prune(lt_api_t *api) {
  char doomed[64][LT_ID_MAX + 1];
  int n = 0;
  lt_map_iter_t it = {0};
  int64_t now = lt_time_mono_ms();
  while (api->ready && n < 64 && lt_map_next(api->early_results, &it)) {
    int64_t from = ((early_t *)it.value)->at_ms; /* a minute from the later of its first and the catch-up */
    if (from < api->ready_at_ms) from = api->ready_at_ms;
    if (now - from > 60000) snprintf(doomed[n++], LT_ID_MAX + 1, "%s", it.key);
  }
  for (int i = 0; i < n; i++) {
    early_t *e = lt_map_get(api->early_results, doomed[i]);
    lt_log_warn("api", "session %s: %zu answer(s) of calls dropped: the session never showed in the log", doomed[i], e->n);
    api->nearly_results -= e->n;
    lt_map_del(api->early_results, doomed[i]);
    early_free(e);
  }
}

lt_err_t lt_api_early_start(lt_api_t *api, char *errstr, size_t n) {
  if (!(api->early_results = lt_map_new(NULL))) return LT_ERR_NOMEM; /* values: early_t, freed here */
  return lt_avro_decoder_new(api->reg, &api->result_dec, errstr, n);
}

void lt_api_early_free(lt_api_t *api) {
  lt_map_iter_t it = {0};
  while (api->early_results && lt_map_next(api->early_results, &it)) early_free(it.value);
  lt_map_destroy(api->early_results);
  lt_avro_decoder_destroy(api->result_dec);
  api->early_results = NULL;
  api->result_dec = NULL;
  api->nearly_results = 0; /* a late on_job (a delivery at the stop) finds nothing */
}
