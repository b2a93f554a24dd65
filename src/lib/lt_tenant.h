/* lt_tenant: tenants, their quotas and API keys, folded from lathe.tenants.
 *
 * lathe.tenants is a compacted topic of TenantUpserted records, the latest per tenant. Every
 * process that needs tenants (API, scheduler, worker) folds it into an lt_tenant_table_t with
 * the same code. API keys are never stored: a key is "lt_<key_id>_<secret>" and the record holds
 * only SHA-256 of the whole key; authentication finds the key id and compares hashes in constant
 * time (CRYPTO_memcmp through lt_crypto_ct_equal).
 *
 * Thread safety: one thread at a time per table (the API folds and reads on its event loop). */
#ifndef LT_TENANT_H
#define LT_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_avro.h"
#include "lt_err.h"
#include "lt_jobspec.h"

#define LT_TENANT_MAX_KEYS 8
#define LT_TENANT_KEY_ID_LEN 16   /* hex characters of a key id */
#define LT_TENANT_SECRET_LEN 40   /* hex characters of a key's secret part */
#define LT_TENANT_WRAPPED_MAX 256 /* bytes of a wrapped data key */
#define LT_TENANT_LABEL_MAX 63    /* bytes of a key's label */
#define LT_TENANT_MODELS_MAX 8    /* models one key may be limited to (v5) */
#define LT_TENANT_MODELS_BYTES 255 /* their ids together, a space between each */
/* "lt_" + key id + "_" + secret + NUL */
#define LT_TENANT_API_KEY_SIZE (3 + LT_TENANT_KEY_ID_LEN + 1 + LT_TENANT_SECRET_LEN + 1)

typedef struct lt_tenant_quotas {
  int32_t max_running_slots;  /* 0: no limit */
  int32_t max_queued_jobs;    /* 0: no limit */
  int64_t max_job_duration_s; /* 0: no limit */
  int64_t max_dataset_bytes;  /* per dataset file; 0: no limit */
  int64_t max_storage_bytes;  /* its datasets and artifacts together; 0: the API's figure (TenantUpserted v2) */
} lt_tenant_quotas_t;

/* What a key may do (TenantUpserted v3 api_keys[].role; viewer from v4, inference from v5; a key
 * of a record before v3 is an admin key). A member key may do everything an admin key may but
 * approve staff access to the tenant's data (any key but a viewer or inference key may close that
 * door: deny, revoke; only an admin key opens it) and delete a dataset or a job (lt_api.c,
 * admin_routes and role_needed). A viewer key (v4) reads: GET routes only (a dashboard's key). An
 * inference key (v5) samples: only the routes the sampler serves (completions, chat completions,
 * models, the tokenizer), none of the tenant's jobs, datasets, artifacts or settings (the key an
 * application holds). Admin, member and viewer are ordered: a larger value may do less; inference
 * stands apart (it may sample, which a viewer may not) and is the least as to the tenant's data. */
typedef enum lt_tenant_role {
  LT_TENANT_ROLE_ADMIN = 0,
  LT_TENANT_ROLE_MEMBER = 1,
  LT_TENANT_ROLE_VIEWER = 2,
  LT_TENANT_ROLE_INFERENCE = 3,
} lt_tenant_role_t;

typedef struct lt_tenant_key {
  char key_id[LT_TENANT_KEY_ID_LEN + 1];
  uint8_t sha256[32];
  int64_t created_at_ms;
  bool revoked;
  lt_tenant_role_t role;
  char label[LT_TENANT_LABEL_MAX + 1]; /* what the key is for (v4), "" for none */
  /* The models it may sample from (v5), their ids with a space between each; "" for any of the
   * tenant's (lt_tenant_key_may_use). */
  char models[LT_TENANT_MODELS_BYTES + 1];
} lt_tenant_key_t;

typedef struct lt_tenant {
  char tenant_id[LT_ID_MAX + 1];
  char display_name[128];
  double weight;
  lt_tenant_quotas_t quotas;
  int nkeys;
  lt_tenant_key_t keys[LT_TENANT_MAX_KEYS];
  char data_key_id[LT_ID_MAX + 1];
  uint8_t wrapped_data_key[LT_TENANT_WRAPPED_MAX];
  size_t wrapped_data_key_len;
  bool disabled;
  int64_t updated_at_ms; /* its record's occurred_at: the fold refuses an older one (a replay, lt_proj) */
} lt_tenant_t;

typedef struct lt_tenant_table lt_tenant_table_t;

lt_err_t lt_tenant_table_new(lt_tenant_table_t **out);
void lt_tenant_table_destroy(lt_tenant_table_t *t);

/* Replaces (or adds) the tenant with this id: the latest record wins, like compaction. */
lt_err_t lt_tenant_upsert(lt_tenant_table_t *t, const lt_tenant_t *tenant);

/* Reads a TenantUpserted record into *out (LT_ERR_INVALID naming the field when malformed). */
lt_err_t lt_tenant_from_record(lt_avro_record_t *rec, lt_tenant_t *out, char *errstr, size_t errstr_size);

/* Writes *tenant into a TenantUpserted record (stamping is the caller's). */
lt_err_t lt_tenant_to_record(const lt_tenant_t *tenant, lt_avro_record_t *rec, char *errstr,
                             size_t errstr_size);

/* The tenant, or NULL. Valid until the next upsert. */
const lt_tenant_t *lt_tenant_get(const lt_tenant_table_t *t, const char *tenant_id);
size_t lt_tenant_count(const lt_tenant_table_t *t);
/* The i-th tenant in tenant-id order (stable), or NULL. */
const lt_tenant_t *lt_tenant_at(const lt_tenant_table_t *t, size_t i);

/* Finds the tenant whose live (not revoked) key is `api_key`. LT_ERR_AUTH for anything else
 * (malformed, unknown, revoked, tenant disabled) — the same answer for each, so a caller learns
 * nothing about which. */
lt_err_t lt_tenant_authenticate(const lt_tenant_table_t *t, const char *api_key, const lt_tenant_t **out);

/* The tenant's key with this key id (live or revoked), or NULL. */
const lt_tenant_key_t *lt_tenant_key(const lt_tenant_t *tenant, const char *key_id);
/* "admin", "member", "viewer" or "inference"; lt_tenant_role_parse: false for another word. */
const char *lt_tenant_role_name(lt_tenant_role_t role);
bool lt_tenant_role_parse(const char *s, lt_tenant_role_t *out);
/* The first TenantUpserted version that can hold a live key of this role: an older reader would
 * read it as another role (v3 readers count an unknown role as member) or not at all. */
int lt_tenant_role_version(lt_tenant_role_t role);
/* A key's models one by one: *at starts at k->models; each call returns the next id (not
 * NUL-terminated) with its length in *len, or NULL after the last. */
const char *lt_tenant_model_next(const char **at, size_t *len);
/* Whether key k (NULL: none, any model) may name model when it samples: its list of models (v5)
 * is empty or holds model exactly. */
bool lt_tenant_key_may_use(const lt_tenant_key_t *k, const char *model);
/* Whether key k may use the tokenizer of base model `base`: a model it may use is that base, or
 * an adapter of it ("ft:<base>:..."). */
bool lt_tenant_key_may_tokenize(const lt_tenant_key_t *k, const char *base);
/* Adds model to k's list: false with why (n bytes) when it is not printable ASCII without spaces,
 * is empty, is listed already, or the list would pass LT_TENANT_MODELS_MAX models or
 * LT_TENANT_MODELS_BYTES bytes. */
bool lt_tenant_key_add_model(lt_tenant_key_t *k, const char *model, char *why, size_t n);

/* Makes a new API key: writes it (NUL-terminated, LT_TENANT_API_KEY_SIZE bytes) to key_out and
 * adds its hash to *tenant, an admin key (set keys[nkeys - 1].role for another); with revoke_old,
 * every earlier key is revoked (rotation).
 * LT_ERR_QUOTA when the tenant already has LT_TENANT_MAX_KEYS keys live. */
lt_err_t lt_tenant_add_key(lt_tenant_t *tenant, bool revoke_old, int64_t now_ms,
                           char key_out[LT_TENANT_API_KEY_SIZE]);

#endif
