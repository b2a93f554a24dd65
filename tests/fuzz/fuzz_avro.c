/* fuzz_avro: Avro records as they arrive from Kafka (lt_avro_*): single-object decoding with
 * resolution of any writer version to the newest reader, bare bodies of a chosen writer schema,
 * the JSON form (`lathe record encode`, upstream tools) and the schema canonical form.
 *
 * First byte: mode (low 2 bits) and, for modes 1 and 2, the second byte picks a schema.
 *   0  lt_avro_decode of the rest (mixed-type topics)
 *   1  lt_avro_record_decode_body of the rest, written with the chosen schema version
 *   2  lt_avro_record_from_json of the rest into the chosen record type
 *   3  lt_avro_canonical_form of the rest as schema text
 * Property: whatever was accepted re-encodes to bytes that decode and re-encode to the same
 * bytes (decode -> encode -> decode is the identity), and its JSON form reads back to them. */
#include <string.h>

#include "fuzz.h"
#include "lt_avro.h"

static const lt_avro_registry_t *registry(void) {
  static lt_avro_registry_t *reg;
  if (!reg) {
    char err[256];
    if (lt_avro_registry_new(&reg, err, sizeof err)) {
      fprintf(stderr, "fuzz_avro: registry: %s\n", err);
      abort();
    }
  }
  return reg;
}

/* rec (accepted) encodes; those bytes decode into a fresh record of its type and encode the
 * same; its JSON form reads back into a record that encodes the same too. */
static void check_round_trip(const lt_avro_registry_t *reg, lt_avro_record_t *rec) {
  char err[512];
  const uint8_t *enc;
  size_t len;
  lt_err_t e = lt_avro_record_encode(rec, &enc, &len, err, sizeof err);
  FUZZ_CHECK(e == LT_OK, "an accepted %s does not encode: %s", lt_avro_record_type(rec), err);
  uint8_t *first = malloc(len);
  memcpy(first, enc, len);
  lt_avro_record_t *again = NULL;
  e = lt_avro_record_new(reg, lt_avro_record_type(rec), &again, err, sizeof err);
  FUZZ_CHECK(e == LT_OK, "%s", err);
  e = lt_avro_record_decode(again, first, len, err, sizeof err);
  FUZZ_CHECK(e == LT_OK, "re-encoded %s does not decode: %s", lt_avro_record_type(rec), err);
  e = lt_avro_record_encode(again, &enc, &len, err, sizeof err);
  FUZZ_CHECK(e == LT_OK && memcmp(enc, first, len) == 0, "%s: decode -> encode is not the identity",
             lt_avro_record_type(rec));
  char *json = NULL;
  if (lt_avro_record_to_json(rec, &json, err, sizeof err) == LT_OK) {
    lt_avro_record_clear(again);
    e = lt_avro_record_from_json(again, json, strlen(json), err, sizeof err);
    FUZZ_CHECK(e == LT_OK, "%s: its own JSON form is refused: %s (%s)", lt_avro_record_type(rec), err, json);
    e = lt_avro_record_encode(again, &enc, &len, err, sizeof err);
    FUZZ_CHECK(e == LT_OK && memcmp(enc, first, len) == 0, "%s: JSON round trip changed the record (%s)",
               lt_avro_record_type(rec), json);
  }
  free(json);
  free(first);
  lt_avro_record_destroy(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const lt_avro_registry_t *reg = registry();
  uint8_t mode = fuzz_take(&data, &size) & 3;
  const lt_avro_schema_t *schema = NULL;
  if (mode == 1 || mode == 2)
    schema = lt_avro_registry_at(reg, fuzz_take(&data, &size) % lt_avro_registry_count(reg));
  char err[512];
  if (mode == 0) {
    lt_avro_decoder_t *dec = NULL;
    if (lt_avro_decoder_new(reg, &dec, err, sizeof err)) abort();
    lt_avro_record_t *rec = NULL;
    if (lt_avro_decode(dec, data, size, &rec, err, sizeof err) == LT_OK) check_round_trip(reg, rec);
    lt_avro_decoder_destroy(dec);
  } else if (mode == 1 || mode == 2) {
    lt_avro_record_t *rec = NULL;
    if (lt_avro_record_new(reg, lt_avro_schema_name(schema), &rec, err, sizeof err)) abort();
    lt_err_t e = mode == 1 ? lt_avro_record_decode_body(rec, schema, data, size, err, sizeof err)
                           : lt_avro_record_from_json(rec, (const char *)data, size, err, sizeof err);
    if (e == LT_OK) check_round_trip(reg, rec);
    lt_avro_record_destroy(rec);
  } else {
    char *canon = NULL;
    size_t clen = 0;
    if (lt_avro_canonical_form((const char *)data, size, &canon, &clen, err, sizeof err) == LT_OK) {
      /* The canonical form is a fixed point. */
      char *again = NULL;
      size_t alen = 0;
      lt_err_t e = lt_avro_canonical_form(canon, clen, &again, &alen, err, sizeof err);
      FUZZ_CHECK(e == LT_OK && alen == clen && memcmp(again, canon, clen) == 0,
                 "canonical form of the canonical form differs: %s", canon);
      free(again);
    }
    free(canon);
  }
  return 0;
}
