/* lathe admin: operator commands that write straight to Kafka (no API in between).
 *
 *   lathe admin tenant create ID [--name TEXT] [--weight W] [--max-running N] [--max-queued N]
 *                                [--max-duration S] [--max-dataset-bytes B] [--max-storage-bytes B]
 *                                [--json]
 *   lathe admin tenant update ID [same options]
 *   lathe admin tenant rotate-key ID [--json]
 *   lathe admin tenant add-key ID [--role admin|member|viewer|inference] [--label TEXT] [--model M]...
 *                                 [--json]
 *   lathe admin tenant revoke-key ID KEY_ID [--json]
 *   lathe admin tenant list [--json]
 *   lathe admin replay ...        (lt_cli_replay.c)
 *   lathe admin queue [--json]    (lt_cli_queue.c: the scheduler's operator endpoint)
 *
 * Tenants live in lathe.tenants (compacted, one TenantUpserted per tenant). create makes the
 * tenant's data key, wraps it with the master key (LATHE_MASTER_KEY_FILE / LATHE_MASTER_KEY) and
 * prints the first API key: the only time it is shown, only its hash is stored. A record is
 * written with acks=all before anything is printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lt_avro.h"
#include "lt_cli_api.h"
#include "lt_cli_args.h"
#include "lt_bus.h"
#include "lt_config.h"
#include "lt_crypto.h"
#include "lt_proj.h"
#include "lt_recmac.h"
#include "lt_tenant.h"
#include "lt_time.h"

int lt_cli_admin_replay(int argc, char **argv); /* lt_cli_replay.c */
int lt_cli_admin_access(int argc, char **argv); /* lt_cli_access.c */
int lt_cli_admin_staff(int argc, char **argv);  /* lt_cli_access.c */
int lt_cli_admin_queue(int argc, char **argv);  /* lt_cli_queue.c */
int lt_cli_admin_drain(int argc, char **argv);  /* lt_cli_drain.c */

static void usage(FILE *f) {
  fprintf(f, "usage: lathe admin tenant create ID [--name TEXT] [--weight W] [--max-running N]\n"
             "                     [--max-queued N] [--max-duration S] [--max-dataset-bytes B]\n"
             "                     [--max-storage-bytes B] [--json]\n"
             "           --max-storage-bytes: the tenant's datasets and artifacts together (0: the\n"
             "           API's LATHE_API_MAX_STORAGE_BYTES applies)\n"
             "       lathe admin tenant update ID [same options]\n"
             "       lathe admin tenant rotate-key ID [--json]   a new admin key; every other key revoked\n"
             "       lathe admin tenant add-key ID [--role admin|member|viewer|inference] [--label TEXT]\n"
             "                     [--model M]... [--json]\n"
             "           another key (default admin); a member key may do everything except approve\n"
             "           staff access to the tenant's data (it may deny and revoke) and delete\n"
             "           datasets or jobs; a viewer key only reads (GET); an inference key only\n"
             "           samples (/v1/completions, /v1/chat/completions, /v1/models, /v1/tokenize,\n"
             "           /v1/detokenize): the key an application holds. --model (an inference key,\n"
             "           up to 8): the models it may sample from, as a request's model names them\n"
             "           (default: any of the tenant's). --label: what the key is for (a dashboard,\n"
             "           CI), shown by list\n"
             "       lathe admin tenant revoke-key ID KEY_ID [--json]\n"
             "           one key revoked (KEY_ID: the 16 hex characters after \"lt_\" in the key; list\n"
             "           shows them); the tenant's other keys keep working\n"
             "       lathe admin tenant list [--json]\n"
             "       lathe admin topics [FILE]     the roles' ACLs (ops/acls.tsv, or LATHE_ACLS_FILE), then\n"
             "                                     the topics of ops/topics.tsv (or FILE)\n"
             "       lathe admin replay [--from-beginning|--from-offset N|--from-time ISO8601]\n"
             "       lathe admin access ...        staff access to a tenant's data (see --help)\n"
             "       lathe admin staff add NAME    a staff key\n"
             "       lathe admin queue [--json]    the scheduler's queue, fairness and fleet (see --help)\n"
             "       lathe admin drain WORKER      a running worker drains, as SIGTERM on its host (see --help)\n"
             "\nReads LATHE_KAFKA_BOOTSTRAP, LATHE_TOPIC_PREFIX, the admin principal\n"
             "(LATHE_KAFKA_CONFIG_DIR/admin.properties, or LATHE_KAFKA_CONFIG) and the master key\n"
             "(LATHE_MASTER_KEY_FILE or LATHE_MASTER_KEY) from the environment. Tenant records are\n"
             "signed with a key derived from the master key; records without a valid signature are\n"
             "skipped (and said) when tenants are read.\n");
}

typedef struct {
  lt_bus_conf_t *bus;
  lt_avro_registry_t *reg;
  lt_proj_t *proj;
  lt_crypto_kek_t *kek;
  lt_recmac_key_t *mac; /* signs what we write, checks what we read (docs/DESIGN.md §5a) */
  char topic[128];
} admin_t;

static void admin_free(admin_t *a) {
  lt_proj_destroy(a->proj);
  lt_recmac_key_destroy(a->mac);
  lt_crypto_kek_destroy(a->kek);
  lt_avro_registry_destroy(a->reg);
  lt_bus_conf_destroy(a->bus);
}

/* Folds lathe.tenants up to its end into a->proj, signed records only: an update must never carry
 * a forged key hash forward under a new, valid MAC. */
static int load_tenants(admin_t *a) {
  char err[512];
  a->bus = lt_bus_conf_new();
  if (!a->bus || lt_bus_conf_from_env(a->bus, err, sizeof err) || lt_bus_conf_for_role(a->bus, "admin", err, sizeof err) ||
      lt_avro_registry_new(&a->reg, err, sizeof err) || lt_proj_new(a->reg, &a->proj, err, sizeof err) ||
      lt_crypto_kek_from_env(&a->kek, err, sizeof err) ||
      lt_recmac_key_new(a->kek, LT_RECMAC_TENANTS, &a->mac, err, sizeof err)) {
    fprintf(stderr, "lathe admin: %s\n", err);
    return 1;
  }
  lt_proj_require_tenant_mac(a->proj, a->mac);
  lt_bus_topic_name(a->bus, "tenants", a->topic, sizeof a->topic);
  lt_bus_consumer_t *c = NULL;
  if (lt_bus_consumer_new(a->bus, NULL, &c, err, sizeof err) ||
      lt_bus_consumer_assign_topic(c, a->topic, LT_BUS_OFFSET_BEGINNING, 10000, NULL, err, sizeof err)) {
    fprintf(stderr, "lathe admin: %s (is the broker up? ops/stack up)\n", err);
    lt_bus_consumer_destroy(c);
    return 1;
  }
  /* A compacted topic of one record per tenant: read until a quiet second. */
  for (;;) {
    const lt_bus_msg_t *m;
    if (lt_bus_consumer_poll(c, 1000, &m, err, sizeof err)) {
      fprintf(stderr, "lathe admin: reading %s: %s\n", a->topic, err);
      lt_bus_consumer_destroy(c);
      return 1;
    }
    if (!m) break;
    if (lt_proj_fold_msg(a->proj, m, NULL, NULL, NULL, err, sizeof err))
      fprintf(stderr, "lathe admin: skipping %s offset %lld: %s\n", a->topic, (long long)lt_bus_msg_offset(m), err);
  }
  lt_bus_consumer_destroy(c);
  return 0;
}

static int write_tenant(admin_t *a, const lt_tenant_t *t) {
  char err[512];
  lt_avro_record_t *rec = NULL;
  lt_bus_producer_t *p = NULL;
  const uint8_t *bytes;
  size_t len;
  int rc = 1;
  /* v1 unless the tenant has a storage quota of its own (v2), a live member key (v3), a live viewer
   * key or a key's label (v4), or a live inference key or a key's models (v5): a reader older than
   * the version (a process not yet upgraded) cannot decode it and would miss the record, a key's
   * rotation or revocation included; one that could would read a viewer key as a member key, an
   * inference key as a viewer, a key limited to some models as one that may use them all */
  int version = t->quotas.max_storage_bytes ? 2 : 1;
  for (int k = 0; k < t->nkeys; k++) {
    if (t->keys[k].revoked) continue;
    int need = t->keys[k].models[0] ? 5 : t->keys[k].label[0] ? 4 : 1;
    if (lt_tenant_role_version(t->keys[k].role) > need) need = lt_tenant_role_version(t->keys[k].role);
    version = need > version ? need : version;
  }
  const lt_avro_schema_t *schema = lt_avro_schema_find(a->reg, "TenantUpserted", version);
  int64_t at = lt_time_wall_ms();
  if (at <= t->updated_at_ms) at = t->updated_at_ms + 1; /* after the record folded, whatever this clock says */
  if (lt_avro_record_new_schema(a->reg, schema, &rec, err, sizeof err) ||
      lt_avro_record_stamp(rec, "admin/cli") || lt_avro_set_long(rec, "occurred_at", at) ||
      lt_tenant_to_record(t, rec, err, sizeof err) ||
      lt_avro_record_encode(rec, &bytes, &len, err, sizeof err) ||
      lt_bus_producer_new(a->bus, NULL, &p, err, sizeof err)) {
    fprintf(stderr, "lathe admin: %s\n", err);
    goto out;
  }
  if (lt_recmac_produce_sync(p, a->mac, a->topic, "tenants", t->tenant_id, bytes, len, 15000, err, sizeof err)) {
    fprintf(stderr, "lathe admin: the tenant record was not written: %s\n", err);
    goto out;
  }
  rc = 0;
out:
  lt_bus_producer_destroy(p, 5000);
  lt_avro_record_destroy(rec);
  return rc;
}

enum { O_NAME = 256, O_WEIGHT, O_MAX_RUNNING, O_MAX_QUEUED, O_MAX_DURATION, O_MAX_DATASET_BYTES, O_MAX_STORAGE_BYTES, O_JSON,
       O_ROLE, O_LABEL, O_MODEL };

/* The options of tenant create|update|rotate-key|add-key|revoke-key|list (rotate-key, revoke-key, list: --json only;
 * add-key: --role, --label, --model and --json, into key, not NULL then); into t (may be NULL then) or key.
 * Returns -1 to go on with the operands in a, or the exit status. */
static int tenant_args(lt_cli_args_t *a, int argc, char **argv, lt_tenant_t *t, lt_tenant_key_t *key, bool *json) {
  static const struct option opts[] = {{"name", required_argument, NULL, O_NAME},
                                       {"weight", required_argument, NULL, O_WEIGHT},
                                       {"max-running", required_argument, NULL, O_MAX_RUNNING},
                                       {"max-queued", required_argument, NULL, O_MAX_QUEUED},
                                       {"max-duration", required_argument, NULL, O_MAX_DURATION},
                                       {"max-dataset-bytes", required_argument, NULL, O_MAX_DATASET_BYTES},
                                       {"max-storage-bytes", required_argument, NULL, O_MAX_STORAGE_BYTES},
                                       {"json", no_argument, NULL, O_JSON},
                                       {0}};
  static const struct option key_opts[] = {{"role", required_argument, NULL, O_ROLE},
                                           {"label", required_argument, NULL, O_LABEL},
                                           {"model", required_argument, NULL, O_MODEL},
                                           {"json", no_argument, NULL, O_JSON},
                                           {0}};
  a->opts = key ? key_opts : t ? opts : opts + 7;
  int c;
  double d = 0;
  char why[320];
  while ((c = lt_cli_args_next(a, argc, argv)) >= 0) {
    switch (c) {
    case O_JSON: *json = true; break;
    case O_ROLE:
      if (!lt_tenant_role_parse(a->value, &key->role)) {
        fprintf(stderr, "lathe %s: --role is admin, member, viewer or inference, not \"%.40s\"\n", a->what, a->value);
        return 2;
      }
      break;
    case O_LABEL:
      if (strlen(a->value) > LT_TENANT_LABEL_MAX) {
        fprintf(stderr, "lathe %s: --label is %zu bytes; at most %d\n", a->what, strlen(a->value), LT_TENANT_LABEL_MAX);
        return 2;
      }
      for (const char *ch = a->value; *ch; ch++)
        if ((unsigned char)*ch < 0x20 || (unsigned char)*ch >= 0x7f) {
          fprintf(stderr, "lathe %s: --label is printable ASCII (byte %zu is 0x%02x)\n", a->what,
                  (size_t)(ch - a->value), (unsigned char)*ch);
          return 2;
        }
      snprintf(key->label, sizeof key->label, "%s", a->value);
      break;
    case O_MODEL:
      if (!lt_tenant_key_add_model(key, a->value, why, sizeof why)) {
        fprintf(stderr, "lathe %s: --model: %s\n", a->what, why);
        return 2;
      }
      break;
    case O_NAME: snprintf(t->display_name, sizeof t->display_name, "%s", a->value); break;
    case O_WEIGHT:
      if (!lt_cli_args_num(a, "--weight", 0.01, 1000, false, &d)) return 2;
      t->weight = d;
      break;
    case O_MAX_RUNNING:
      if (!lt_cli_args_num(a, "--max-running", 0, 100000, true, &d)) return 2;
      t->quotas.max_running_slots = (int32_t)d;
      break;
    case O_MAX_QUEUED:
      if (!lt_cli_args_num(a, "--max-queued", 0, 1000000, true, &d)) return 2;
      t->quotas.max_queued_jobs = (int32_t)d;
      break;
    case O_MAX_DURATION:
      if (!lt_cli_args_num(a, "--max-duration", 0, 365 * 86400.0, true, &d)) return 2;
      t->quotas.max_job_duration_s = (int64_t)d;
      break;
    case O_MAX_DATASET_BYTES:
      if (!lt_cli_args_num(a, "--max-dataset-bytes", 0, 1e13, true, &d)) return 2;
      t->quotas.max_dataset_bytes = (int64_t)d;
      break;
    case O_MAX_STORAGE_BYTES:
      if (!lt_cli_args_num(a, "--max-storage-bytes", 0, 1e15, true, &d)) return 2;
      t->quotas.max_storage_bytes = (int64_t)d;
      break;
    }
  }
  if (c == LT_CLI_ARGS_END && key && key->models[0] && key->role != LT_TENANT_ROLE_INFERENCE) {
    fprintf(stderr, "lathe %s: --model limits an inference key (--role inference); a %s key reaches more than "
                    "sampling\n", a->what, lt_tenant_role_name(key->role));
    return 2;
  }
  return c == LT_CLI_ARGS_END ? -1 : a->status;
}

/* The models key k is limited to, as a JSON array ([] for any). */
static json_t *models_json(const lt_tenant_key_t *k) {
  json_t *a = json_array();
  const char *at = k->models, *p;
  size_t len;
  while (a && (p = lt_tenant_model_next(&at, &len))) json_array_append_new(a, json_stringn(p, len));
  return a;
}

/* A revoked key shows no role: the record that revokes a tenant's last member key is written in a
 * version without roles (write_tenant), in which every key reads as admin. */
static void print_tenant(const lt_tenant_t *t, const char *api_key, bool json) {
  int live = 0, members = 0;
  for (int k = 0; k < t->nkeys; k++) live += !t->keys[k].revoked;
  for (int k = 0; k < t->nkeys; k++) members += !t->keys[k].revoked && t->keys[k].role != LT_TENANT_ROLE_ADMIN;
  /* members: every live key that is not an admin's (member, viewer and inference keys) */
  if (json) { /* through jansson: a display name may hold quotes */
    json_t *o = json_pack("{s:s,s:s,s:f,s:i,s:i,s:I,s:I,s:I,s:i,s:b}", "tenant_id", t->tenant_id, "name",
                          t->display_name, "weight", t->weight, "max_running_slots",
                          t->quotas.max_running_slots, "max_queued_jobs", t->quotas.max_queued_jobs,
                          "max_job_duration_s", (json_int_t)t->quotas.max_job_duration_s,
                          "max_dataset_bytes", (json_int_t)t->quotas.max_dataset_bytes, "max_storage_bytes",
                          (json_int_t)t->quotas.max_storage_bytes, "live_keys", live,
                          "disabled", t->disabled);
    json_t *keys = json_array();
    for (int k = 0; o && keys && k < t->nkeys; k++)
      json_array_append_new(keys, json_pack("{s:s,s:s?,s:s,s:o,s:b,s:I}", "key_id", t->keys[k].key_id, "role",
                                            t->keys[k].revoked ? NULL : lt_tenant_role_name(t->keys[k].role),
                                            "label", t->keys[k].label, "models", models_json(&t->keys[k]),
                                            "revoked", t->keys[k].revoked,
                                            "created_at", (json_int_t)t->keys[k].created_at_ms));
    if (o) json_object_set_new(o, "keys", keys ? keys : json_array());
    else json_decref(keys);
    if (o && api_key) json_object_set_new(o, "api_key", json_string(api_key));
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    printf("%s\n", text ? text : "{}");
    free(text);
    json_decref(o);
    return;
  }
  printf("tenant %s (%s): weight %g, max running %d, max queued %d, max duration %llds, max dataset %lld bytes, "
         "max storage %lld bytes, %d live key(s) (%d not admin)%s\n",
         t->tenant_id, t->display_name, t->weight, t->quotas.max_running_slots, t->quotas.max_queued_jobs,
         (long long)t->quotas.max_job_duration_s, (long long)t->quotas.max_dataset_bytes,
         (long long)t->quotas.max_storage_bytes, live, members,
         t->disabled ? ", DISABLED" : "");
  for (int k = 0; k < t->nkeys; k++) {
    char when[32];
    printf("  key %s: %s, made %s UTC%s%s%s%s%s\n", t->keys[k].key_id,
           t->keys[k].revoked ? "revoked" : lt_tenant_role_name(t->keys[k].role),
           lt_cli_time(t->keys[k].created_at_ms, when, sizeof when), t->keys[k].label[0] ? " (" : "",
           t->keys[k].label, t->keys[k].label[0] ? ")" : "", t->keys[k].models[0] ? ", models: " : "",
           t->keys[k].models);
  }
  if (api_key) printf("API key (shown once, store it now): %s\n", api_key);
}

static int tenant_list(int argc, char **argv) {
  lt_cli_args_t a = {.what = "admin tenant list", .usage = usage};
  bool json = false;
  int rc = tenant_args(&a, argc, argv, NULL, NULL, &json);
  if (rc >= 0) return rc;
  admin_t ad = {0};
  rc = load_tenants(&ad);
  lt_tenant_table_t *tt = rc ? NULL : lt_proj_tenants(ad.proj); /* no projection when the bus was refused */
  for (size_t i = 0; tt && i < lt_tenant_count(tt); i++) print_tenant(lt_tenant_at(tt, i), NULL, json);
  admin_free(&ad);
  return rc;
}

/* True when id is a tenant id; else says why. */
static bool tenant_id_ok(const char *id) {
  if (lt_id_valid(id)) return true;
  fprintf(stderr, "lathe admin: tenant id \"%s\" must be 1-63 characters of A-Z a-z 0-9 . _ -\n", id);
  return false;
}

/* create, update, rotate-key, add-key ID. The options are read before the broker is asked (so
 * --help and mistakes need none), and again over the tenant as it is. */
static int tenant_write(int argc, char **argv) {
  const char *verb = argv[0];
  bool create = strcmp(verb, "create") == 0, rotate = strcmp(verb, "rotate-key") == 0,
       add = strcmp(verb, "add-key") == 0;
  lt_tenant_key_t spec = {.role = LT_TENANT_ROLE_ADMIN}; /* add-key: the new key's role, label and models */
  char what[48];
  snprintf(what, sizeof what, "admin tenant %s", verb);
  lt_cli_args_t a = {.what = what, .usage = usage, .min = 1, .max = 1};
  lt_tenant_t t = {0};
  bool json = false;
  int rc = tenant_args(&a, argc, argv, rotate || add ? NULL : &t, add ? &spec : NULL, &json);
  if (rc >= 0) return rc;
  const char *id = a.operands[0];
  if (!tenant_id_ok(id)) return 2;
  admin_t ad = {0};
  if ((rc = load_tenants(&ad))) goto out;
  const lt_tenant_t *cur = lt_tenant_get(lt_proj_tenants(ad.proj), id);
  char key[LT_TENANT_API_KEY_SIZE], err[512];
  if (create) {
    if (cur) {
      fprintf(stderr, "lathe admin: tenant %s exists; use update or rotate-key\n", id);
      rc = 1;
      goto out;
    }
    memset(&t, 0, sizeof t);
    snprintf(t.tenant_id, sizeof t.tenant_id, "%s", id);
    snprintf(t.display_name, sizeof t.display_name, "%s", id);
    t.weight = 1.0;
    t.quotas.max_queued_jobs = 100;
    lt_crypto_kek_t *kek = NULL;
    lt_crypto_dek_t *dek = NULL;
    const char *key_id = "dek-1"; /* bound to the tenant by the wrap; a rotation makes dek-2 */
    if (lt_crypto_kek_from_env(&kek, err, sizeof err) || lt_crypto_dek_generate(&dek, id, key_id, err, sizeof err) ||
        lt_crypto_dek_wrap(kek, dek, t.wrapped_data_key, sizeof t.wrapped_data_key, &t.wrapped_data_key_len, err,
                           sizeof err)) {
      fprintf(stderr, "lathe admin: %s\n", err);
      lt_crypto_dek_destroy(dek);
      lt_crypto_kek_destroy(kek);
      rc = 1;
      goto out;
    }
    snprintf(t.data_key_id, sizeof t.data_key_id, "%s", key_id);
    lt_crypto_dek_destroy(dek);
    lt_crypto_kek_destroy(kek);
  } else {
    if (!cur) {
      fprintf(stderr, "lathe admin: no tenant %s\n", id);
      rc = 1;
      goto out;
    }
    t = *cur;
  }
  lt_cli_args_t again = {.what = what, .usage = usage, .min = 1, .max = 1}; /* read once already */
  if (!add) tenant_args(&again, argc, argv, rotate ? NULL : &t, NULL, &json);
  bool want_key = create || rotate || add;
  if (want_key && lt_tenant_add_key(&t, rotate, lt_time_wall_ms(), key)) {
    fprintf(stderr, "lathe admin: tenant %s has the most live keys allowed (%d)\n", id, LT_TENANT_MAX_KEYS);
    rc = 1;
    goto out;
  }
  if (add) {
    lt_tenant_key_t *k = &t.keys[t.nkeys - 1];
    k->role = spec.role;
    snprintf(k->label, sizeof k->label, "%s", spec.label);
    snprintf(k->models, sizeof k->models, "%s", spec.models);
  }
  if ((rc = write_tenant(&ad, &t))) goto out;
  print_tenant(&t, want_key ? key : NULL, json);
out:
  admin_free(&ad);
  return rc;
}

/* revoke-key ID KEY_ID: the one key revoked (a leaked key), the others kept. The key is named by
 * its id alone: the whole key would put its secret in the process list and the shell's history. */
static int tenant_revoke_key(int argc, char **argv) {
  lt_cli_args_t a = {.what = "admin tenant revoke-key", .usage = usage, .min = 2, .max = 2};
  bool json = false;
  int rc = tenant_args(&a, argc, argv, NULL, NULL, &json);
  if (rc >= 0) return rc;
  const char *id = a.operands[0], *key_id = a.operands[1];
  if (!tenant_id_ok(id)) return 2;
  if (strncmp(key_id, "lt_", 3) == 0) {
    fprintf(stderr, "lathe admin: give the key's id (the %d hex characters after \"lt_\"), not the key: a key "
                    "on a command line is in the process list and the shell's history\n", LT_TENANT_KEY_ID_LEN);
    return 2;
  }
  if (strlen(key_id) != LT_TENANT_KEY_ID_LEN || strspn(key_id, "0123456789abcdef") != LT_TENANT_KEY_ID_LEN) {
    fprintf(stderr, "lathe admin: KEY_ID \"%.40s\" is not %d lowercase hex characters\n", key_id, LT_TENANT_KEY_ID_LEN);
    return 2;
  }
  admin_t ad = {0};
  if ((rc = load_tenants(&ad))) goto out;
  const lt_tenant_t *cur = lt_tenant_get(lt_proj_tenants(ad.proj), id);
  if (!cur) {
    fprintf(stderr, "lathe admin: no tenant %s\n", id);
    rc = 1;
    goto out;
  }
  lt_tenant_t t = *cur;
  const lt_tenant_key_t *found = lt_tenant_key(&t, key_id);
  lt_tenant_key_t *k = found ? &t.keys[found - t.keys] : NULL;
  if (!k) {
    fprintf(stderr, "lathe admin: tenant %s has no key %s (lathe admin tenant list shows its keys)\n", id,
            key_id);
    rc = 1;
    goto out;
  }
  if (k->revoked) {
    fprintf(stderr, "lathe admin: key %s of tenant %s was already revoked; nothing written\n", key_id, id);
  } else {
    k->revoked = true;
    if ((rc = write_tenant(&ad, &t))) goto out;
    int live = 0, admins = 0;
    for (int i = 0; i < t.nkeys; i++) live += !t.keys[i].revoked;
    for (int i = 0; i < t.nkeys; i++) admins += !t.keys[i].revoked && t.keys[i].role == LT_TENANT_ROLE_ADMIN;
    fprintf(stderr, "lathe admin: key %s of tenant %s revoked%s\n", key_id, id,
            !live     ? "; the tenant has no live key now (lathe admin tenant add-key makes one)"
            : !admins ? "; the tenant has no live admin key now: nothing can approve staff access or delete its "
                        "datasets and jobs (lathe admin tenant add-key ID --role admin makes one)"
                      : "");
  }
  print_tenant(&t, NULL, json);
out:
  admin_free(&ad);
  return rc;
}

static int tenant_cmd(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {
      {"create", tenant_write}, {"update", tenant_write}, {"rotate-key", tenant_write}, {"add-key", tenant_write},
      {"revoke-key", tenant_revoke_key}, {"list", tenant_list}};
  return lt_cli_args_dispatch("admin tenant", usage, verbs, sizeof verbs / sizeof *verbs, NULL, argc, argv);
}

/* lathe admin topics [FILE]: the roles' ACLs of ops/acls.tsv, then every topic of
 * ops/topics.tsv, under LATHE_TOPIC_PREFIX. ACLs first: under a new prefix the admin principal
 * itself may create topics only once its own ACLs exist (docs/DESIGN.md §5a). A broker without
 * an authorizer has no ACLs to set, which is said and not an error. */
static int topics_cmd(int argc, char **argv) {
  lt_cli_args_t a = {.what = "admin topics", .usage = usage, .max = 1};
  int c = lt_cli_args_next(&a, argc, argv);
  if (c != LT_CLI_ARGS_END) return a.status;
  const char *path = a.noperands ? a.operands[0] : getenv("LATHE_TOPICS_FILE"); /* NULL: built in */
  const char *acls = getenv("LATHE_ACLS_FILE");                        /* NULL: built in */
  char err[512];
  lt_bus_conf_t *bus = lt_bus_conf_new();
  lt_bus_admin_t *admin = NULL;
  int created = 0, rc = 1;
  size_t nacl = 0, skipped = 0;
  if (!bus || lt_bus_conf_from_env(bus, err, sizeof err) || lt_bus_conf_for_role(bus, "admin", err, sizeof err) ||
      lt_bus_admin_new(bus, &admin, err, sizeof err)) {
    fprintf(stderr, "lathe admin topics: %s\n", err);
    goto out;
  }
  lt_err_t e = lt_bus_admin_create_acls(admin, acls, 30000, &nacl, &skipped, err, sizeof err);
  if (e == LT_ERR_INVALID || e == LT_ERR_IO) {
    fprintf(stderr, "lathe admin topics: %s\n", err);
    goto out;
  }
  if (e) fprintf(stderr, "lathe admin topics: no ACLs set: %s\n", err);
  else
    printf("%zu ACL(s) for the roles from %s (%zu transactional-id line(s) left to Kafka's tools)\n", nacl,
           acls ? acls : "the built-in ops/acls.tsv", skipped);
  if (lt_bus_admin_create_from_file(admin, path, -1, 30000, &created, err, sizeof err)) {
    fprintf(stderr, "lathe admin topics: %s\n", err);
    goto out;
  }
  printf("%d topic(s) created from %s (prefix \"%s\")\n", created, path ? path : "the built-in ops/topics.tsv",
         lt_bus_conf_get(bus, "lathe.topic.prefix"));
  /* Topics made by an older release keep their configs until told (lathe.jobs was kept 7 days) */
  int altered = 0;
  char changes[2048];
  if (lt_bus_admin_reconcile_from_file(admin, path, 30000, &altered, changes, sizeof changes, err, sizeof err)) {
    fprintf(stderr, "lathe admin topics: %s\n", err);
    goto out;
  }
  if (altered) printf("%d existing topic(s) brought to the file's configs: %s\n", altered, changes);
  rc = 0;
out:
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(bus);
  return rc;
}

int lt_cli_admin(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {{"tenant", tenant_cmd},           {"topics", topics_cmd},
                                        {"access", lt_cli_admin_access}, {"staff", lt_cli_admin_staff},
                                        {"queue", lt_cli_admin_queue},   {"replay", lt_cli_admin_replay},
                                        {"drain", lt_cli_admin_drain}};
  return lt_cli_args_dispatch("admin", usage, verbs, sizeof verbs / sizeof *verbs, NULL, argc, argv);
}
