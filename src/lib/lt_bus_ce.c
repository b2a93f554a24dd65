/* lt_bus_ce: the CloudEvents headers every produced record carries (docs/EVENTS.md).
 *
 * Tools that do not know Lathe's schemas (a Kafka UI, kcat, a CloudEvents SDK, a router that
 * sorts events by type) need to tell records apart without decoding Avro. The CloudEvents Kafka
 * binding in binary content mode gives them names for that: ce_type, ce_id, ce_source, ce_time
 * and content-type as headers beside an untouched value. Doing it in the producer rather than in
 * each caller means no record can leave Lathe without them and no caller can get them wrong.
 *
 * Everything comes from the value's own bytes: the single-object header gives the fingerprint,
 * the fingerprint the record name, and the envelope every schema opens with (event_id,
 * occurred_at, producer: tests/schema_check.py holds that order) gives id, time and source, read
 * in place without decoding the rest. So headers never carry a field beyond the envelope, and
 * the envelope carries ids and a time only, never tenant content. A value that is not a
 * single-object message of a schema this build knows gets no ce_ headers: there is no type to
 * name. Nothing is allocated per record. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lt_avro.h"
#include "lt_bus_int.h"

typedef struct ce_type {
  uint64_t fingerprint;
  const char *name; /* borrowed from lt_avro_embedded_schemas */
  int version;
  bool envelope; /* fields 0..2 are event_id (string), occurred_at (long), producer (string) */
} ce_type_t;

struct lt_bus_ce_names {
  size_t n;
  ce_type_t types[];
};

static int cmp_fp(const void *a, const void *b) {
  const ce_type_t *x = a, *y = b;
  return (x->fingerprint > y->fingerprint) - (x->fingerprint < y->fingerprint);
}

/* True when the schema opens with the envelope in the order the reader below expects. */
static bool has_envelope(const char *json, size_t len) {
  json_t *j = json_loadb(json, len, 0, NULL);
  json_t *f = j ? json_object_get(j, "fields") : NULL;
  static const char *const names[] = {"event_id", "occurred_at", "producer"};
  bool ok = json_is_array(f) && json_array_size(f) >= 3;
  for (size_t i = 0; ok && i < 3; i++) {
    json_t *field = json_array_get(f, i);
    json_t *t = json_object_get(field, "type");
    if (json_is_object(t)) t = json_object_get(t, "type");
    const char *want = i == 1 ? "long" : "string";
    ok = json_is_string(json_object_get(field, "name")) &&
         strcmp(json_string_value(json_object_get(field, "name")), names[i]) == 0 &&
         json_is_string(t) && strcmp(json_string_value(t), want) == 0;
  }
  json_decref(j);
  return ok;
}

lt_err_t lt_bus_ce_names_new(lt_bus_ce_names_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  size_t n = lt_avro_embedded_count;
  lt_bus_ce_names_t *t = calloc(1, sizeof *t + n * sizeof t->types[0]);
  if (!t) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const lt_avro_embedded_t *e = &lt_avro_embedded_schemas[i];
    char *canon;
    size_t clen;
    lt_err_t rc = lt_avro_canonical_form(e->json, e->json_len, &canon, &clen, errstr, errstr_size);
    if (rc) {
      free(t);
      return rc;
    }
    t->types[i] = (ce_type_t){.fingerprint = lt_avro_crc64(canon, clen), .name = e->name,
                              .version = e->version, .envelope = has_envelope(e->json, e->json_len)};
    free(canon);
  }
  t->n = n;
  qsort(t->types, n, sizeof t->types[0], cmp_fp);
  *out = t;
  return LT_OK;
}

void lt_bus_ce_names_destroy(lt_bus_ce_names_t *t) { free(t); }

/* Avro's zig-zag varint long at *p (at most 10 bytes before end); false when truncated. */
static bool read_long(const uint8_t **p, const uint8_t *end, int64_t *v) {
  uint64_t u = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    u |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
      return true;
    }
  }
  return false;
}

static bool read_string(const uint8_t **p, const uint8_t *end, const char **s, size_t *len) {
  int64_t n;
  if (!read_long(p, end, &n) || n < 0 || n > end - *p) return false;
  *s = (const char *)*p;
  *len = (size_t)n;
  *p += n;
  return true;
}

/* An id or a producer name may go into a header only when it is short and of the characters
 * ids are made of: a record written by hand (`lathe topic produce`, an upstream producer) could
 * put anything there, and headers must stay free of content. */
static bool id_like(const char *s, size_t len, size_t max) {
  if (len == 0 || len > max) return false;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          (c && strchr("-_.:/@", c))))
      return false;
  }
  return true;
}

static bool caller_has(const lt_bus_record_t *rec, const char *name) {
  for (size_t i = 0; i < rec->header_count; i++)
    if (rec->headers[i].name && strcmp(rec->headers[i].name, name) == 0) return true;
  return false;
}

static void add(lt_bus_ce_t *out, const lt_bus_record_t *rec, const char *name, const char *value) {
  if (caller_has(rec, name)) return; /* the caller's own value wins */
  out->h[out->n++] = (lt_bus_header_t){.name = name, .value = value, .size = strlen(value)};
}

size_t lt_bus_ce_fill(const lt_bus_ce_names_t *t, const char *fallback_source,
                      const lt_bus_record_t *rec, lt_bus_ce_t *out) {
  out->n = 0;
  uint64_t fp;
  if (!t || !rec->value || lt_avro_peek(rec->value, rec->value_size, &fp, NULL, 0)) return 0;
  ce_type_t key = {.fingerprint = fp};
  const ce_type_t *ty = bsearch(&key, t->types, t->n, sizeof t->types[0], cmp_fp);
  if (!ty) return 0;

  const uint8_t *p = (const uint8_t *)rec->value + LT_AVRO_HEADER_SIZE;
  const uint8_t *end = (const uint8_t *)rec->value + rec->value_size;
  const char *id = NULL, *producer = NULL;
  size_t id_len = 0, producer_len = 0;
  int64_t at = 0;
  bool env = ty->envelope && read_string(&p, end, &id, &id_len) && read_long(&p, end, &at) &&
             read_string(&p, end, &producer, &producer_len);
  char fphex[17];
  lt_avro_fingerprint_hex(fp, fphex);

  if (env && id_like(id, id_len, 64))
    snprintf(out->id, sizeof out->id, "%.*s", (int)id_len, id);
  else /* stable across retries and replays of the same bytes */
    snprintf(out->id, sizeof out->id, "%s-%016llx", fphex,
             (unsigned long long)lt_avro_crc64(rec->value, rec->value_size));
  if (env && id_like(producer, producer_len, 64))
    snprintf(out->source, sizeof out->source, "lathe/%.*s", (int)producer_len, producer);
  else
    snprintf(out->source, sizeof out->source, "lathe/%s", fallback_source ? fallback_source : "lathe");
  snprintf(out->type, sizeof out->type, "%s%s", LT_BUS_CE_TYPE_PREFIX, ty->name);
  snprintf(out->dataschema, sizeof out->dataschema, "lathe:schema/%s/v%d/%s", ty->name,
           ty->version, fphex);
  snprintf(out->fingerprint, sizeof out->fingerprint, "%s", fphex);

  add(out, rec, LT_BUS_CE_SPECVERSION, "1.0");
  add(out, rec, LT_BUS_CE_ID, out->id);
  add(out, rec, LT_BUS_CE_SOURCE, out->source);
  add(out, rec, LT_BUS_CE_TYPE, out->type);
  if (env && at > 0) {
    time_t secs = (time_t)(at / 1000);
    struct tm tm;
    if (gmtime_r(&secs, &tm) && tm.tm_year + 1900 <= 9999) {
      char day[24];
      strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
      snprintf(out->time, sizeof out->time, "%s.%03dZ", day, (int)(at % 1000));
      add(out, rec, LT_BUS_CE_TIME, out->time);
    }
  }
  add(out, rec, LT_BUS_CE_CONTENT_TYPE, LT_BUS_CE_MEDIA_TYPE);
  add(out, rec, LT_BUS_CE_DATASCHEMA, out->dataschema);
  add(out, rec, LT_BUS_CE_FINGERPRINT, out->fingerprint);
  return out->n;
}
