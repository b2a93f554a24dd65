/* lt_tenant: the tenant table and API key authentication (see lt_tenant.h). */
#include "lt_tenant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "lt_crypto.h"

struct lt_tenant_table {
  lt_tenant_t *v; /* sorted by tenant_id */
  size_t n, cap;
};

lt_err_t lt_tenant_table_new(lt_tenant_table_t **out) {
  *out = calloc(1, sizeof **out);
  return *out ? LT_OK : LT_ERR_NOMEM;
}

void lt_tenant_table_destroy(lt_tenant_table_t *t) {
  if (!t) return;
  if (t->v) OPENSSL_cleanse(t->v, t->cap * sizeof *t->v);
  free(t->v);
  free(t);
}

/* Binary search: index of id, or where it would go (*found false). */
static size_t find(const lt_tenant_table_t *t, const char *id, bool *found) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(t->v[mid].tenant_id, id);
    if (c == 0) {
      *found = true;
      return mid;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  *found = false;
  return lo;
}

lt_err_t lt_tenant_upsert(lt_tenant_table_t *t, const lt_tenant_t *tenant) {
  if (!lt_id_valid(tenant->tenant_id)) return LT_ERR_INVALID;
  bool found;
  size_t i = find(t, tenant->tenant_id, &found);
  if (!found) {
    if (t->n == t->cap) {
      size_t cap = t->cap ? t->cap * 2 : 16;
      lt_tenant_t *v = realloc(t->v, cap * sizeof *v);
      if (!v) return LT_ERR_NOMEM;
      t->v = v;
      t->cap = cap;
    }
    memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof *t->v);
    t->n++;
  }
  t->v[i] = *tenant;
  return LT_OK;
}

const lt_tenant_t *lt_tenant_get(const lt_tenant_table_t *t, const char *id) {
  if (!id) return NULL;
  bool found;
  size_t i = find(t, id, &found);
  return found ? &t->v[i] : NULL;
}

size_t lt_tenant_count(const lt_tenant_table_t *t) { return t->n; }

const lt_tenant_t *lt_tenant_at(const lt_tenant_table_t *t, size_t i) { return i < t->n ? &t->v[i] : NULL; }

static bool is_hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

lt_err_t lt_tenant_authenticate(const lt_tenant_table_t *t, const char *key, const lt_tenant_t **out) {
  *out = NULL;
  if (!key || strlen(key) != LT_TENANT_API_KEY_SIZE - 1 || strncmp(key, "lt_", 3) != 0 ||
      key[3 + LT_TENANT_KEY_ID_LEN] != '_' || !is_hex(key + 3, LT_TENANT_KEY_ID_LEN) ||
      !is_hex(key + 4 + LT_TENANT_KEY_ID_LEN, LT_TENANT_SECRET_LEN))
    return LT_ERR_AUTH;
  uint8_t h[32];
  lt_crypto_sha256(key, strlen(key), h);
  /* Tenants are few (hundreds to thousands) and keys per tenant few: a scan by key id is cheap
   * and the hash comparison is constant-time. */
  for (size_t i = 0; i < t->n; i++) {
    const lt_tenant_t *tn = &t->v[i];
    for (int k = 0; k < tn->nkeys; k++) {
      if (memcmp(tn->keys[k].key_id, key + 3, LT_TENANT_KEY_ID_LEN) != 0) continue;
      if (!lt_crypto_ct_equal(tn->keys[k].sha256, h, 32)) return LT_ERR_AUTH;
      if (tn->keys[k].revoked || tn->disabled) return LT_ERR_AUTH;
      *out = tn;
      return LT_OK;
    }
  }
  return LT_ERR_AUTH;
}

const lt_tenant_key_t *lt_tenant_key(const lt_tenant_t *tn, const char *key_id) {
  for (int k = 0; tn && key_id && k < tn->nkeys; k++)
    if (strcmp(tn->keys[k].key_id, key_id) == 0) return &tn->keys[k];
  return NULL;
}

static const struct {
  const char *name;
  int version;
} roles[] = {[LT_TENANT_ROLE_ADMIN] = {"admin", 1},
             [LT_TENANT_ROLE_MEMBER] = {"member", 3},
             [LT_TENANT_ROLE_VIEWER] = {"viewer", 4},
             [LT_TENANT_ROLE_INFERENCE] = {"inference", 5}};

const char *lt_tenant_role_name(lt_tenant_role_t role) { return roles[role].name; }

int lt_tenant_role_version(lt_tenant_role_t role) { return roles[role].version; }

bool lt_tenant_role_parse(const char *s, lt_tenant_role_t *out) {
  for (size_t i = 0; s && i < sizeof roles / sizeof *roles; i++)
    if (strcmp(s, roles[i].name) == 0) {
      *out = (lt_tenant_role_t)i;
      return true;
    }
  return false;
}

const char *lt_tenant_model_next(const char **at, size_t *len) {
  if (!**at) return NULL;
  const char *id = *at;
  *len = strcspn(id, " ");
  *at = id + *len + (id[*len] == ' ');
  return id;
}

bool lt_tenant_key_may_use(const lt_tenant_key_t *k, const char *model) {
  if (!k || !k->models[0]) return true;
  size_t n = strlen(model), len;
  const char *at = k->models;
  for (const char *p; (p = lt_tenant_model_next(&at, &len));)
    if (len == n && memcmp(p, model, n) == 0) return true;
  return false;
}

bool lt_tenant_key_may_tokenize(const lt_tenant_key_t *k, const char *base) {
  if (lt_tenant_key_may_use(k, base)) return true;
  size_t n = strlen(base), len;
  const char *at = k->models;
  for (const char *p; (p = lt_tenant_model_next(&at, &len));)
    if (len > n + 4 && strncmp(p, "ft:", 3) == 0 && memcmp(p + 3, base, n) == 0 && p[3 + n] == ':') return true;
  return false;
}

bool lt_tenant_key_add_model(lt_tenant_key_t *k, const char *model, char *why, size_t n) {
  size_t len = strlen(model), used = strlen(k->models), count = used ? 1 : 0;
  for (const char *p = k->models; *p; p++) count += *p == ' ';
  if (!len) return snprintf(why, n, "a model is empty"), false;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)model[i] <= 0x20 || (unsigned char)model[i] >= 0x7f)
      return snprintf(why, n, "model \"%.80s\" holds a space or a byte that is not printable ASCII (byte %zu)", model, i),
             false;
  if (k->models[0] && lt_tenant_key_may_use(k, model))
    return snprintf(why, n, "model %.200s is listed twice", model), false;
  if (count == LT_TENANT_MODELS_MAX)
    return snprintf(why, n, "more than %d models for one key", LT_TENANT_MODELS_MAX), false;
  if (used + (used ? 1 : 0) + len > LT_TENANT_MODELS_BYTES)
    return snprintf(why, n, "the models' ids come to %zu bytes together, over %d", used + (used ? 1 : 0) + len,
                    LT_TENANT_MODELS_BYTES),
           false;
  snprintf(k->models + used, sizeof k->models - used, "%s%s", used ? " " : "", model);
  return true;
}

lt_err_t lt_tenant_add_key(lt_tenant_t *tn, bool revoke_old, int64_t now_ms, char key_out[LT_TENANT_API_KEY_SIZE]) {
  if (revoke_old)
    for (int k = 0; k < tn->nkeys; k++) tn->keys[k].revoked = true;
  /* Drop revoked keys when the table is full: they can never authenticate again. */
  if (tn->nkeys == LT_TENANT_MAX_KEYS) {
    int w = 0;
    for (int k = 0; k < tn->nkeys; k++)
      if (!tn->keys[k].revoked) tn->keys[w++] = tn->keys[k];
    tn->nkeys = w;
  }
  if (tn->nkeys == LT_TENANT_MAX_KEYS) return LT_ERR_QUOTA;
  uint8_t raw[(LT_TENANT_KEY_ID_LEN + LT_TENANT_SECRET_LEN) / 2];
  lt_err_t err = lt_crypto_random(raw, sizeof raw);
  if (err) return err;
  char *p = key_out;
  p += sprintf(p, "lt_");
  for (size_t i = 0; i < LT_TENANT_KEY_ID_LEN / 2; i++) p += sprintf(p, "%02x", raw[i]);
  *p++ = '_';
  for (size_t i = LT_TENANT_KEY_ID_LEN / 2; i < sizeof raw; i++) p += sprintf(p, "%02x", raw[i]);
  lt_tenant_key_t *k = &tn->keys[tn->nkeys++];
  memset(k, 0, sizeof *k);
  memcpy(k->key_id, key_out + 3, LT_TENANT_KEY_ID_LEN);
  lt_crypto_sha256(key_out, strlen(key_out), k->sha256);
  k->created_at_ms = now_ms;
  OPENSSL_cleanse(raw, sizeof raw);
  return LT_OK;
}

static void copy_field(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src ? src : ""); }

lt_err_t lt_tenant_from_record(lt_avro_record_t *rec, lt_tenant_t *out, char *errstr, size_t n) {
  memset(out, 0, sizeof *out);
  const char *s;
  size_t len;
#define NEED(call)                                                                                 \
  do {                                                                                             \
    if ((call) != LT_OK)                                                                           \
      return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted: %s", lt_avro_record_error(rec));  \
  } while (0)
  NEED(lt_avro_get_string(rec, "tenant_id", &s, &len));
  if (!lt_id_valid(s)) return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted: tenant_id \"%.80s\" is not a valid id", s);
  copy_field(out->tenant_id, sizeof out->tenant_id, s);
  lt_avro_get_long(rec, "occurred_at", &out->updated_at_ms);
  NEED(lt_avro_get_string(rec, "display_name", &s, NULL));
  copy_field(out->display_name, sizeof out->display_name, s);
  NEED(lt_avro_get_double(rec, "weight", &out->weight));
  NEED(lt_avro_get_int(rec, "quotas.max_running_slots", &out->quotas.max_running_slots));
  NEED(lt_avro_get_int(rec, "quotas.max_queued_jobs", &out->quotas.max_queued_jobs));
  NEED(lt_avro_get_long(rec, "quotas.max_job_duration_s", &out->quotas.max_job_duration_s));
  NEED(lt_avro_get_long(rec, "quotas.max_dataset_bytes", &out->quotas.max_dataset_bytes));
  NEED(lt_avro_get_long(rec, "quotas.max_storage_bytes", &out->quotas.max_storage_bytes)); /* v1: 0 */
  if (out->quotas.max_storage_bytes < 0)
    return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted: quotas.max_storage_bytes is %lld; it must be >= 0",
                   (long long)out->quotas.max_storage_bytes);
  NEED(lt_avro_get_string(rec, "key_id", &s, NULL));
  copy_field(out->data_key_id, sizeof out->data_key_id, s);
  const void *p;
  NEED(lt_avro_get_bytes(rec, "wrapped_data_key", &p, &len));
  if (len > sizeof out->wrapped_data_key)
    return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted: wrapped_data_key is %zu bytes, over %d", len,
                   LT_TENANT_WRAPPED_MAX);
  memcpy(out->wrapped_data_key, p, len);
  out->wrapped_data_key_len = len;
  NEED(lt_avro_get_bool(rec, "disabled", &out->disabled));
  size_t nk = 0;
  NEED(lt_avro_array_size(rec, "api_keys", &nk));
  if (nk > LT_TENANT_MAX_KEYS)
    return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted: %zu api_keys, over %d", nk, LT_TENANT_MAX_KEYS);
  for (size_t i = 0; i < nk; i++) {
    char path[64];
    lt_tenant_key_t *k = &out->keys[i];
    snprintf(path, sizeof path, "api_keys[%zu].key_id", i);
    NEED(lt_avro_get_string(rec, path, &s, NULL));
    copy_field(k->key_id, sizeof k->key_id, s);
    snprintf(path, sizeof path, "api_keys[%zu].sha256", i);
    NEED(lt_avro_get_string(rec, path, &s, NULL));
    if (lt_crypto_unhex(s, k->sha256, 32, NULL, 0) != LT_OK)
      return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted: %s is not 64 hex digits", path);
    snprintf(path, sizeof path, "api_keys[%zu].created_at", i);
    NEED(lt_avro_get_long(rec, path, &k->created_at_ms));
    snprintf(path, sizeof path, "api_keys[%zu].revoked", i);
    NEED(lt_avro_get_bool(rec, path, &k->revoked));
    snprintf(path, sizeof path, "api_keys[%zu].role", i);
    k->role = LT_TENANT_ROLE_ADMIN; /* v3; before it every key was an admin key */
    /* A role this version does not know (a forged or broken record: a later role comes in a later
     * version, which this one cannot decode): the key authenticates nowhere. */
    if (lt_avro_get_string(rec, path, &s, NULL) == LT_OK && !lt_tenant_role_parse(s, &k->role)) {
      k->role = LT_TENANT_ROLE_ADMIN; /* moot: revoked */
      k->revoked = true;
    }
    snprintf(path, sizeof path, "api_keys[%zu].label", i); /* v4; "" before */
    if (lt_avro_get_string(rec, path, &s, NULL) == LT_OK) copy_field(k->label, sizeof k->label, s);
    size_t nm = 0;
    snprintf(path, sizeof path, "api_keys[%zu].models", i); /* v5; none before */
    if (lt_avro_array_size(rec, path, &nm) != LT_OK) nm = 0;
    for (size_t m = 0; m < nm; m++) {
      char why[320];
      snprintf(path, sizeof path, "api_keys[%zu].models[%zu]", i, m);
      NEED(lt_avro_get_string(rec, path, &s, &len));
      if (strlen(s) != len) snprintf(why, sizeof why, "it holds a NUL byte");
      if (strlen(s) != len || !lt_tenant_key_add_model(k, s, why, sizeof why))
        return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted: %s: %s", path, why);
    }
  }
  out->nkeys = (int)nk;
#undef NEED
  return LT_OK;
}

lt_err_t lt_tenant_to_record(const lt_tenant_t *tn, lt_avro_record_t *rec, char *errstr, size_t n) {
#define SET(call)                                                                                  \
  do {                                                                                             \
    if ((call) != LT_OK)                                                                           \
      return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted: %s", lt_avro_record_error(rec));  \
  } while (0)
  SET(lt_avro_set_string(rec, "tenant_id", tn->tenant_id));
  SET(lt_avro_set_string(rec, "display_name", tn->display_name));
  SET(lt_avro_set_double(rec, "weight", tn->weight));
  SET(lt_avro_set_int(rec, "quotas.max_running_slots", tn->quotas.max_running_slots));
  SET(lt_avro_set_int(rec, "quotas.max_queued_jobs", tn->quotas.max_queued_jobs));
  SET(lt_avro_set_long(rec, "quotas.max_job_duration_s", tn->quotas.max_job_duration_s));
  SET(lt_avro_set_long(rec, "quotas.max_dataset_bytes", tn->quotas.max_dataset_bytes));
  if (lt_avro_schema_version(lt_avro_record_schema(rec)) >= 2)
    SET(lt_avro_set_long(rec, "quotas.max_storage_bytes", tn->quotas.max_storage_bytes));
  else if (tn->quotas.max_storage_bytes)
    return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted v1 has no quotas.max_storage_bytes (%lld asked): write v2",
                   (long long)tn->quotas.max_storage_bytes);
  SET(lt_avro_set_string(rec, "key_id", tn->data_key_id));
  SET(lt_avro_set_bytes(rec, "wrapped_data_key", tn->wrapped_data_key, tn->wrapped_data_key_len));
  SET(lt_avro_set_bool(rec, "disabled", tn->disabled));
  SET(lt_avro_array_clear(rec, "api_keys"));
  for (int i = 0; i < tn->nkeys; i++) {
    char path[64], hex[65];
    size_t idx;
    SET(lt_avro_array_append(rec, "api_keys", &idx));
    for (int b = 0; b < 32; b++) sprintf(hex + 2 * b, "%02x", tn->keys[i].sha256[b]);
    snprintf(path, sizeof path, "api_keys[%zu].key_id", idx);
    SET(lt_avro_set_string(rec, path, tn->keys[i].key_id));
    snprintf(path, sizeof path, "api_keys[%zu].sha256", idx);
    SET(lt_avro_set_string(rec, path, hex));
    snprintf(path, sizeof path, "api_keys[%zu].created_at", idx);
    SET(lt_avro_set_long(rec, path, tn->keys[i].created_at_ms));
    snprintf(path, sizeof path, "api_keys[%zu].revoked", idx);
    SET(lt_avro_set_bool(rec, path, tn->keys[i].revoked));
    snprintf(path, sizeof path, "api_keys[%zu].role", idx);
    lt_tenant_role_t role = tn->keys[i].role;
    int version = lt_avro_schema_version(lt_avro_record_schema(rec));
    if (tn->keys[i].revoked && lt_tenant_role_version(role) > version) role = LT_TENANT_ROLE_ADMIN; /* moot */
    if (version < lt_tenant_role_version(role))
      return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted v%d cannot say that key %s is %s %s key: write v%d",
                     version, tn->keys[i].key_id, role == LT_TENANT_ROLE_INFERENCE ? "an" : "a",
                     lt_tenant_role_name(role), lt_tenant_role_version(role));
    if (version >= 3) SET(lt_avro_set_string(rec, path, lt_tenant_role_name(role)));
    snprintf(path, sizeof path, "api_keys[%zu].label", idx);
    if (version >= 4) SET(lt_avro_set_string(rec, path, tn->keys[i].label));
    else if (tn->keys[i].label[0] && !tn->keys[i].revoked)
      return lt_errf(errstr, n, LT_ERR_INVALID,
                     "TenantUpserted v%d has no api_keys[].label (key %s is \"%s\"): write v4", version,
                     tn->keys[i].key_id, tn->keys[i].label);
    snprintf(path, sizeof path, "api_keys[%zu].models", idx);
    if (version >= 5) {
      SET(lt_avro_array_clear(rec, path));
      const char *at = tn->keys[i].models, *p;
      size_t len;
      while ((p = lt_tenant_model_next(&at, &len))) {
        char one[LT_TENANT_MODELS_BYTES + 1];
        snprintf(one, sizeof one, "%.*s", (int)len, p);
        SET(lt_avro_array_append_string(rec, path, one));
      }
    } else if (tn->keys[i].models[0] && !tn->keys[i].revoked) {
      /* a reader of v4 would let the key sample from every model */
      return lt_errf(errstr, n, LT_ERR_INVALID, "TenantUpserted v%d has no api_keys[].models (key %s is limited to "
                     "%.120s): write v5", version, tn->keys[i].key_id, tn->keys[i].models);
    }
  }
#undef SET
  return LT_OK;
}
