/* fuzz_jobspec: a job submission, both ways it reaches Lathe: the JSON body of POST /v1/jobs
 * (lt_jobspec_from_json) and a JobSubmitted record an upstream service produced into lathe.jobs
 * (lt_jobspec_from_record, then lt_jobspec_validate).
 *
 * First byte: even, the rest is a JSON body; odd, the rest is a JobSubmitted single-object
 * record.
 * Property: an accepted spec validates again; its JSON form (what GET /v1/jobs/{id} shows) is
 * accepted as a submission and gives the same spec; its record form gives it back too. */
#include <string.h>

#include "fuzz.h"
#include "lt_avro.h"
#include "lt_job_record.h"
#include "lt_jobspec.h"

static const lt_avro_registry_t *registry(void) {
  static lt_avro_registry_t *reg;
  char err[256];
  if (!reg && lt_avro_registry_new(&reg, err, sizeof err)) abort();
  return reg;
}

/* The spec's JSON form reads back as the same spec (idempotency_key is not part of it). */
static void check_spec(const lt_jobspec_t *spec) {
  char field[96], msg[256];
  FUZZ_CHECK(lt_jobspec_validate(spec, field, sizeof field, msg, sizeof msg) == LT_OK,
             "an accepted spec fails validation: %s", msg);
  json_t *j = lt_jobspec_to_json(spec);
  lt_jobspec_t *again = calloc(1, sizeof *again);
  lt_err_t e = lt_jobspec_from_json(j, again, field, sizeof field, msg, sizeof msg);
  char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
  FUZZ_CHECK(e == LT_OK, "its JSON form is refused: %s: %s", msg, text);
  json_t *j2 = lt_jobspec_to_json(again);
  char *text2 = json_dumps(j2, JSON_COMPACT | JSON_SORT_KEYS);
  FUZZ_CHECK(json_equal(j, j2), "JSON round trip changed the spec: %s -> %s", text, text2);
  free(text);
  free(text2);
  json_decref(j);
  json_decref(j2);
  /* and the record form */
  lt_avro_record_t *rec = NULL;
  FUZZ_CHECK(lt_avro_record_new(registry(), "JobSubmitted", &rec, msg, sizeof msg) == LT_OK, "%s", msg);
  e = lt_jobspec_to_record(spec, rec, msg, sizeof msg);
  FUZZ_CHECK(e == LT_OK, "an accepted spec has no record form: %s", msg);
  memset(again, 0, sizeof *again);
  e = lt_jobspec_from_record(rec, again, msg, sizeof msg);
  FUZZ_CHECK(e == LT_OK, "its record form is refused: %s", msg);
  j = lt_jobspec_to_json(spec);
  j2 = lt_jobspec_to_json(again);
  FUZZ_CHECK(json_equal(j, j2), "record round trip changed the spec");
  json_decref(j);
  json_decref(j2);
  lt_avro_record_destroy(rec);
  free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t mode = fuzz_take(&data, &size) & 1;
  lt_jobspec_t *spec = calloc(1, sizeof *spec);
  char field[96], msg[256];
  if (mode == 0) {
    json_t *body = json_loadb((const char *)data, size, 0, NULL);
    if (body && lt_jobspec_from_json(body, spec, field, sizeof field, msg, sizeof msg) == LT_OK) check_spec(spec);
    json_decref(body);
  } else {
    lt_avro_record_t *rec = NULL;
    if (lt_avro_record_new(registry(), "JobSubmitted", &rec, msg, sizeof msg)) abort();
    if (lt_avro_record_decode(rec, data, size, msg, sizeof msg) == LT_OK &&
        lt_jobspec_from_record(rec, spec, msg, sizeof msg) == LT_OK &&
        lt_jobspec_validate(spec, field, sizeof field, msg, sizeof msg) == LT_OK)
      check_spec(spec);
    lt_avro_record_destroy(rec);
  }
  free(spec);
  return 0;
}
