/* lt_publisher: `lathed publisher` — folds the control topics through lt_proj, promotes the
 * committed final checkpoint of each completed job from staging to published artifacts, records
 * ArtifactPublished, and collects staging garbage. The layout contract and the rules are in
 * lt_publisher.h. */
#include "lt_publisher.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/crypto.h>

#include "lt_dataset_sweep.h"
#include "lt_job.h"
#include "lt_log.h"
#include "lt_metrics.h"
#include "lt_proj.h"
#include "lt_sealed.h"
#include "lt_tenant.h"
#include "lt_time.h"

#define LOG(...) lt_log(LT_LOG_INFO, "publisher", NULL, __VA_ARGS__)
#define WARN(...) lt_log(LT_LOG_WARN, "publisher", NULL, __VA_ARGS__)
/* A line about one job: its id in its own field of a JSON line. */
#define JLOG(job, ...) lt_log(LT_LOG_INFO, "publisher", LT_LOG_JOB(job), __VA_ARGS__)
#define JWARN(job, ...) lt_log(LT_LOG_WARN, "publisher", LT_LOG_JOB(job), __VA_ARGS__)

/* ---------------------------------------------------------------- the layout */

typedef struct {
  const char *name;
  bool required;
  bool published;
} layout_name_t;

static const layout_name_t names[] = {
    {"adapter_model.safetensors", true, true},
    {"adapter_config.json", true, true},
    {"lathe_run.json", true, true},
    {"eval.json", false, true},
    {"metrics.json", false, true},
    {"samples.json", false, true},
    {"state.bin", false, false},
};
#define NNAMES (sizeof names / sizeof names[0])

static int name_index(const char *name) {
  /* Checkpoints staged before the run configuration was renamed (it collided with a model's
   * config.json) still publish, under the new name. */
  if (strcmp(name, "config.json") == 0) name = "lathe_run.json";
  for (size_t i = 0; i < NNAMES; i++)
    if (strcmp(names[i].name, name) == 0) return (int)i;
  return -1;
}

static bool component_ok(const char *s) { return s && *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, ".."); }

lt_err_t lt_publisher_staging_key(char *out, size_t size, const char *tenant, const char *job, int32_t attempt,
                                  int64_t step, const char *name) {
  if (!component_ok(tenant) || !component_ok(job) || !component_ok(name) || attempt < 1 || step < 0)
    return LT_ERR_INVALID;
  int n = snprintf(out, size, "staging/%s/%s/%d/%" PRId64 "/%s", tenant, job, (int)attempt, step, name);
  return n < 0 || (size_t)n >= size ? LT_ERR_INVALID : LT_OK;
}

lt_err_t lt_publisher_artifact_dek_key(char *out, size_t size, const char *tenant, const char *job) {
  return lt_publisher_artifact_key(out, size, tenant, job, "key.wrapped");
}

lt_err_t lt_publisher_artifact_key(char *out, size_t size, const char *tenant, const char *job, const char *name) {
  if (!component_ok(tenant) || !component_ok(job) || !component_ok(name)) return LT_ERR_INVALID;
  int n = snprintf(out, size, "tenants/%s/artifacts/%s/%s", tenant, job, name);
  return n < 0 || (size_t)n >= size ? LT_ERR_INVALID : LT_OK;
}

/* ---------------------------------------------------------------- one promotion */

static void scrub_free(void *p, size_t n) {
  if (!p) return;
  OPENSSL_cleanse(p, n);
  free(p);
}

static lt_err_t read_config_digest(const void *data, size_t len, char out[65], char *errstr, size_t n) {
  json_error_t je;
  json_t *doc = json_loadb(data, len, 0, &je);
  const char *d = doc ? json_string_value(json_object_get(doc, "config_digest")) : NULL;
  bool ok = d && strlen(d) == 64 && strspn(d, "0123456789abcdef") == 64;
  if (ok) memcpy(out, d, 65);
  json_decref(doc);
  if (!ok)
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "lathe_run.json has no \"config_digest\" of 64 lowercase hex digits (the worker must write "
                   "{\"config_digest\":...,\"spec\":...})");
  return LT_OK;
}

/* One promotion's objects, by position in the checkpoint's key list. */
typedef struct promo {
  int idx[LT_PUBLISHER_MAX_OBJECTS]; /* into names[] */
  void *stored[LT_PUBLISHER_MAX_OBJECTS]; /* as read from staging (sealed) */
  size_t stored_len[LT_PUBLISHER_MAX_OBJECTS];
  void *plain[LT_PUBLISHER_MAX_OBJECTS]; /* decrypted; published objects only */
  size_t plain_len[LT_PUBLISHER_MAX_OBJECTS];
} promo_t;

/* The commit's figures and its layout: the hash it names (into want), every key under this
 * checkpoint's prefix, known names (their index into p->idx), each once, the required ones all
 * there. */
static lt_err_t promote_check(const lt_publisher_checkpoint_t *ck, uint64_t max_bytes, uint8_t want[32], promo_t *p,
                              char *errstr, size_t n) {
  if (ck->nkeys == 0 || ck->nkeys > LT_PUBLISHER_MAX_OBJECTS)
    return lt_errf(errstr, n, LT_ERR_INVALID, "checkpoint of job %s has %zu objects (1..%d allowed)", ck->job_id,
                   ck->nkeys, LT_PUBLISHER_MAX_OBJECTS);
  if (ck->bytes > max_bytes)
    return lt_errf(errstr, n, LT_ERR_INVALID, "checkpoint of job %s is %" PRIu64 " bytes, over the limit of %" PRIu64,
                   ck->job_id, ck->bytes, max_bytes);
  if (!ck->sha256_hex || strlen(ck->sha256_hex) != 64 || lt_crypto_unhex(ck->sha256_hex, want, 32, NULL, 0))
    return lt_errf(errstr, n, LT_ERR_INVALID, "checkpoint of job %s: sha256 \"%s\" is not 64 hex digits", ck->job_id,
                   ck->sha256_hex ? ck->sha256_hex : "");
  char prefix[LT_STORE_KEY_MAX + 1];
  if (lt_publisher_staging_key(prefix, sizeof prefix, ck->tenant_id, ck->job_id, ck->attempt, ck->step, "x"))
    return lt_errf(errstr, n, LT_ERR_INVALID, "checkpoint of job %s: tenant, job, attempt or step is malformed",
                   ck->job_id);
  size_t plen = strlen(prefix) - 1;
  bool seen[NNAMES] = {0};
  for (size_t i = 0; i < ck->nkeys; i++) {
    const char *k = ck->object_keys[i];
    if (!k || strncmp(k, prefix, plen) != 0)
      return lt_errf(errstr, n, LT_ERR_INVALID, "object key \"%s\" is not under %.*s", k ? k : "", (int)plen, prefix);
    int x = p->idx[i] = name_index(k + plen);
    if (x < 0)
      return lt_errf(errstr, n, LT_ERR_INVALID, "object key \"%s\": \"%s\" is not a checkpoint object name", k,
                     k + plen);
    if (seen[x]) return lt_errf(errstr, n, LT_ERR_INVALID, "object \"%s\" is listed twice", k + plen);
    seen[x] = true;
  }
  for (size_t i = 0; i < NNAMES; i++)
    if (names[i].required && !seen[i])
      return lt_errf(errstr, n, LT_ERR_INVALID, "checkpoint of job %s has no %s", ck->job_id, names[i].name);
  return LT_OK;
}

/* Phase 1: reads every staged object and checks the commit's size and hash before any byte is
 * decrypted or written. */
static lt_err_t promote_read(lt_store_t *store, const lt_publisher_checkpoint_t *ck, uint64_t max_bytes,
                             const uint8_t want[32], promo_t *p, lt_publisher_promotion_t *out, char *errstr,
                             size_t n) {
  lt_crypto_sha256_t *h = NULL;
  lt_err_t err = lt_crypto_sha256_new(&h);
  uint64_t total = 0;
  for (size_t i = 0; !err && i < ck->nkeys; i++) {
    err = lt_store_get(store, ck->object_keys[i], (size_t)(max_bytes - total), &p->stored[i], &p->stored_len[i], NULL,
                       errstr, n);
    if (err == LT_ERR_NOT_FOUND)
      err = lt_errf(errstr, n, LT_ERR_NOT_FOUND, "staged object %s is missing", ck->object_keys[i]);
    if (err) break;
    lt_crypto_sha256_update(h, p->stored[i], p->stored_len[i]);
    total += p->stored_len[i];
  }
  out->stored_bytes_read = total;
  if (!err) {
    uint8_t got[32];
    char got_hex[65];
    lt_crypto_sha256_final(h, got);
    if (total != ck->bytes)
      err = lt_errf(errstr, n, LT_ERR_CORRUPT, "checkpoint of job %s: %" PRIu64 " stored bytes, the commit says %" PRIu64,
                    ck->job_id, total, ck->bytes);
    else if (memcmp(got, want, 32) != 0)
      err = lt_errf(errstr, n, LT_ERR_CORRUPT, "checkpoint of job %s: SHA-256 of the stored bytes is %s, the commit says %s",
                    ck->job_id, lt_crypto_hex(got, 32, got_hex), ck->sha256_hex);
  }
  lt_crypto_sha256_destroy(h);
  return err;
}

/* Phase 2: decrypts each published object (every chunk authenticated, bound to its staging key)
 * and describes it in out->artifacts; lathe_run.json gives out->config_digest. */
static lt_err_t promote_open(const lt_crypto_dek_t *dek, const lt_publisher_checkpoint_t *ck, promo_t *p,
                             lt_publisher_promotion_t *out, char *errstr, size_t n) {
  for (size_t i = 0; i < ck->nkeys; i++) {
    const layout_name_t *nm = &names[p->idx[i]];
    if (!nm->published) continue;
    p->plain[i] = malloc(p->stored_len[i] ? p->stored_len[i] : 1);
    if (!p->plain[i]) return LT_ERR_NOMEM;
    char why[256];
    lt_err_t err = lt_crypto_open(dek, ck->object_keys[i], p->stored[i], p->stored_len[i], p->plain[i],
                                  p->stored_len[i], &p->plain_len[i], why, sizeof why);
    if (err) return lt_errf(errstr, n, LT_ERR_CORRUPT, "staged object %s does not decrypt: %s", ck->object_keys[i], why);
    free(p->stored[i]);
    p->stored[i] = NULL;
    lt_publisher_artifact_t *a = &out->artifacts[out->n++];
    snprintf(a->name, sizeof a->name, "%s", nm->name);
    lt_publisher_artifact_key(a->key, sizeof a->key, ck->tenant_id, ck->job_id, nm->name);
    uint8_t d[32];
    lt_crypto_sha256(p->plain[i], p->plain_len[i], d);
    lt_crypto_hex(d, 32, a->sha256);
    a->bytes = p->plain_len[i];
    if (strcmp(nm->name, "lathe_run.json") == 0) {
      err = read_config_digest(p->plain[i], p->plain_len[i], out->config_digest, errstr, n);
      if (err) return err;
    }
  }
  return LT_OK;
}

lt_err_t lt_publisher_promote(lt_store_t *store, const lt_crypto_dek_t *dek, const lt_publisher_checkpoint_t *ck,
                              uint64_t max_bytes, lt_publisher_promotion_t *out, char *errstr, size_t n) {
  memset(out, 0, sizeof *out);
  uint8_t want[32];
  promo_t promo = {0}, *p = &promo;
  lt_err_t err = promote_check(ck, max_bytes, want, p, errstr, n);
  if (!err) err = promote_read(store, ck, max_bytes, want, p, out, errstr, n);
  if (!err) err = promote_open(dek, ck, p, out, errstr, n);
  /* 3. Re-encrypt under the artifact keys. Not yet visible: only ArtifactPublished makes it so. */
  for (size_t i = 0, a = 0; !err && i < ck->nkeys; i++) {
    if (!p->plain[i]) continue;
    err = lt_sealed_put(store, ck->artifact_dek ? ck->artifact_dek : dek, out->artifacts[a].key, p->plain[i],
                        p->plain_len[i], NULL, errstr, n);
    a++;
  }
  for (size_t i = 0; i < ck->nkeys && i < LT_PUBLISHER_MAX_OBJECTS; i++) {
    free(p->stored[i]);
    scrub_free(p->plain[i], p->stored_len[i] > p->plain_len[i] ? p->stored_len[i] : p->plain_len[i]);
  }
  if (err) out->n = 0;
  return err;
}

/* ---------------------------------------------------------------- the daemon */

/* A completion waiting to be promoted. */
typedef struct todo {
  char job_id[LT_ID_MAX + 1];
  int32_t partition;
  int64_t offset;
  void *payload; /* the JobCompleted message, for a DeadLetter */
  size_t len;
  int tries;
  int missing; /* of those, the tries that found a staged object missing */
  int64_t next_ms;
} todo_t;


enum { T_JOBS, T_CONTROL, T_TENANTS, T_ARTIFACTS, T__COUNT };
static const char *const bases[T__COUNT] = {"jobs", "control", "tenants", "artifacts"};

struct lt_publisher {
  struct event_base *base;
  lt_publisher_conf_t conf;
  char producer_id[128];
  char group[128];
  char topics[T__COUNT][256];
  char deadletter[256];
  lt_proj_t *proj;
  lt_keyring_t *keyring;
  lt_bus_consumer_t *consumer;
  lt_bus_producer_t *producer;
  struct event *consumer_ev, *tick_ev;
  /* catch-up */
  lt_bus_tp_t *parts; /* one block with low, high and the ctrl_* arrays (start_consumer) */
  int64_t *low, *high;
  size_t nparts;
  int64_t started_ms, last_record_ms;
  /* lathe.control offsets of the group */
  int ncontrol;
  int64_t *ctrl_start;     /* committed when we started: completions before it were handled */
  int64_t *ctrl_pos;       /* next offset to fold (-1: none yet) */
  int64_t *ctrl_committed; /* what we committed last */
  /* per job: event id of the newest applied CheckpointCommitted, and JobCompleted's naming */
  json_t *ckpt_ev;
  json_t *done_ev;
  json_t *ckpt_dirs; /* job -> its newest committed checkpoints' staging prefixes, oldest first */
  todo_t *todo;
  size_t ntodo, captodo;
  int64_t next_gc_ms;
  uint64_t gc_passes;          /* lt_publisher_gc calls that listed */
  lt_map_t *dataset_suspects;  /* incomplete datasets found by the last sweep (lt_dataset_sweep.h) */
  lt_publisher_stats_t stats;
  bool in_work;
};

static void set_last(lt_publisher_t *p, lt_err_t err, const char *msg) {
  p->stats.last_err = err;
  size_t l = strnlen(msg, sizeof p->stats.last_errmsg - 1);
  memcpy(p->stats.last_errmsg, msg, l);
  p->stats.last_errmsg[l] = '\0';
}

static void todo_remove(lt_publisher_t *p, size_t i) {
  free(p->todo[i].payload);
  memmove(&p->todo[i], &p->todo[i + 1], (p->ntodo - i - 1) * sizeof *p->todo);
  p->ntodo--;
}

static void todo_add(lt_publisher_t *p, const char *job_id, int32_t partition, int64_t offset, const void *v, size_t len) {
  for (size_t i = 0; i < p->ntodo; i++)
    if (strcmp(p->todo[i].job_id, job_id) == 0) return;
  if (p->ntodo == p->captodo) {
    size_t cap = p->captodo ? p->captodo * 2 : 16;
    todo_t *t = realloc(p->todo, cap * sizeof *t);
    if (!t) {
      WARN("out of memory: job %s not queued for promotion", job_id);
      return;
    }
    p->todo = t;
    p->captodo = cap;
  }
  todo_t *t = &p->todo[p->ntodo];
  memset(t, 0, sizeof *t);
  snprintf(t->job_id, sizeof t->job_id, "%s", job_id);
  t->partition = partition;
  t->offset = offset;
  t->payload = malloc(len ? len : 1);
  if (t->payload) memcpy(t->payload, v, len);
  t->len = t->payload ? len : 0;
  p->ntodo++;
}

/* ---------------------------------------------------------------- retention */

/* Committed checkpoints a job keeps: the newest and conf.keep_checkpoints before it. */
static size_t kept_count(const lt_publisher_t *p) {
  return 1 + (size_t)(p->conf.keep_checkpoints > 0 ? p->conf.keep_checkpoints : 0);
}

/* A training session (mode interactive): its checkpoints are the states it saved by name, which
 * load_state may ask for at any time while it lives. */
static bool is_session(json_t *info) {
  const char *mode = json_string_value(json_object_get(json_object_get(info, "spec"), "mode"));
  return mode && strcmp(mode, "interactive") == 0;
}

/* Drops the job's oldest remembered checkpoints beyond kept_count. */
static void trim_checkpoints(lt_publisher_t *p, const char *job_id) {
  json_t *dirs = json_object_get(p->ckpt_dirs, job_id);
  while (json_array_size(dirs) > kept_count(p)) json_array_remove(dirs, 0);
}

/* Remembers the staging prefix ("staging/<t>/<job>/<attempt>/<step>/") of the commit just folded
 * (the newest checkpoint in the job's info), dropping the oldest beyond kept_count, except for a
 * live session, which keeps every state it saved until it ends. */
static void note_checkpoint(lt_publisher_t *p, const char *job_id, json_t *info) {
  json_t *ck = info ? json_object_get(info, "checkpoint") : NULL;
  const char *key = json_string_value(json_array_get(json_object_get(ck, "object_keys"), 0));
  const char *slash = key ? strrchr(key, '/') : NULL;
  if (!slash) return;
  json_t *dirs = json_object_get(p->ckpt_dirs, job_id);
  if (!dirs) json_object_set_new(p->ckpt_dirs, job_id, dirs = json_array());
  json_t *dir = json_stringn(key, (size_t)(slash - key + 1));
  json_t *last = json_array_get(dirs, json_array_size(dirs) - 1);
  if (last && json_equal(last, dir)) { /* a duplicate delivery */
    json_decref(dir);
    return;
  }
  json_array_append_new(dirs, dir);
  if (!is_session(info)) trim_checkpoints(p, job_id);
}

/* Does the retained entry d name key ("staging/<t>/<job>/<attempt>/<step>/<name>"): a staging
 * prefix, or a resume point {step, before} (check_resume): that step of any attempt before. */
static bool entry_names(json_t *d, const char *key) {
  if (json_is_string(d)) return strncmp(key, json_string_value(d), json_string_length(d)) == 0;
  const char *rest = key;
  for (int i = 0; i < 3 && rest; i++) {
    rest = strchr(rest, '/');
    if (rest) rest++;
  }
  int attempt = 0;
  long long step = 0;
  return rest && sscanf(rest, "%d/%lld/", &attempt, &step) == 2 &&
         step == json_integer_value(json_object_get(d, "step")) &&
         attempt < json_integer_value(json_object_get(d, "before"));
}

/* True when retention keeps key (a staging key of job). */
static bool retained(const lt_publisher_t *p, const char *job_id, const char *key) {
  size_t i;
  json_t *d;
  json_array_foreach(json_object_get(p->ckpt_dirs, job_id), i, d) if (entry_names(d, key)) return true;
  return false;
}

/* A dispatch names the commit its attempt resumes from: the newest the scheduler had applied when
 * it decided, so one this publisher folded before the dispatch, in the job's lathe.control
 * partition; not always its newest (the stopped attempt may commit again before the dispatch
 * lands: chaos seed 6944). A resume step this publisher folded no commit at means its consumer or
 * its fold missed a record: chaos seed 6528, where a publisher's GC deleted the checkpoint a new
 * attempt had resumed from, acting in every step as if it never read that commit. Said loudly and
 * counted; and the resume point joins the job's retained checkpoints, whichever earlier attempt
 * wrote it, so the GC and retention keep it as a commit they folded. */
static void check_resume(lt_publisher_t *p, const char *job_id, lt_avro_record_t *rec, json_t *info) {
  const char *want = NULL;
  int64_t step = -1;
  int32_t attempt = 0;
  if (lt_avro_get_string(rec, "resume_checkpoint_event_id", &want, NULL) || !want || !*want ||
      lt_avro_get_long(rec, "resume_step", &step) || lt_avro_get_int(rec, "attempt", &attempt))
    return;
  const char *have = json_string_value(json_object_get(p->ckpt_ev, job_id));
  if (have && strcmp(have, want) == 0) return;
  size_t n = 0;
  const lt_proj_ckpt_t *folded = lt_proj_job_checkpoints(p->proj, job_id, &n);
  for (size_t i = 0; i < n; i++)
    if (folded[i].step == step && folded[i].attempt < attempt) return;
  p->stats.unfolded_resumes++;
  JWARN(job_id,
        "job %s: attempt %d resumes from checkpoint commit %s (step %" PRId64 "), which this publisher never "
        "folded (its newest: %s); that step's staging objects are kept as a committed checkpoint",
        job_id, (int)attempt, want, step, have && *have ? have : "none");
  json_t *dirs = json_object_get(p->ckpt_dirs, job_id);
  if (!dirs) json_object_set_new(p->ckpt_dirs, job_id, dirs = json_array());
  json_array_append_new(dirs, json_pack("{s:I,s:i}", "step", (json_int_t)step, "before", (int)attempt));
  if (!is_session(info)) trim_checkpoints(p, job_id);
}

typedef struct {
  const lt_publisher_t *p;
  const char *job_id;
  json_t *doomed;
} prune_ctx_t;

static lt_err_t prune_visit(void *ctx, const char *key, const lt_store_info_t *info) {
  prune_ctx_t *c = ctx;
  (void)info;
  if (!retained(c->p, c->job_id, key)) json_array_append_new(c->doomed, json_string(key));
  return LT_OK;
}

/* A completed job was published: deletes what retention does not keep of its staging objects.
 * A failure is logged; the periodic GC deletes what is left after the grace period. */
static void prune_job(lt_publisher_t *p, const char *tenant_id, const char *job_id) {
  char prefix[LT_STORE_KEY_MAX + 1], next[LT_STORE_KEY_MAX + 1] = "", after[LT_STORE_KEY_MAX + 1] = "", err[256];
  snprintf(prefix, sizeof prefix, "staging/%s/%s/", tenant_id, job_id);
  prune_ctx_t c = {.p = p, .job_id = job_id, .doomed = json_array()};
  lt_err_t e;
  do {
    e = lt_store_list(p->conf.store, prefix, after, 0, prune_visit, &c, next, sizeof next, err, sizeof err);
    snprintf(after, sizeof after, "%s", next);
  } while (!e && next[0]);
  size_t i;
  json_t *k;
  json_array_foreach(c.doomed, i, k) {
    if (e) break;
    if (!(e = lt_store_delete(p->conf.store, json_string_value(k), err, sizeof err))) p->stats.pruned++;
  }
  if (e) JWARN(job_id, "job %s: retention: %s (the GC retries)", job_id, err);
  else if (json_array_size(c.doomed))
    JLOG(job_id, "job %s: retention: deleted %zu staging objects, kept %zu checkpoints", job_id,
         json_array_size(c.doomed),
        json_array_size(json_object_get(p->ckpt_dirs, job_id)));
  json_decref(c.doomed);
}

/* Each checkpoint commit read, applied or not, with where it lies in the log: what the GC keeps
 * follows from these, so a missing one explains a deleted checkpoint. During catch-up (the whole
 * retained log, at every start) only with conf.log_commits: the chaos driver sets it. */
static void log_commit(lt_publisher_t *p, const lt_proj_result_t *res) {
  if (!p->stats.ready && !p->conf.log_commits) return;
  const char *jid = NULL;
  int32_t attempt = 0;
  int64_t step = 0;
  lt_avro_get_string(res->record, "job_id", &jid, NULL);
  lt_avro_get_int(res->record, "attempt", &attempt);
  lt_avro_get_long(res->record, "step", &step);
  const lt_job_t *j = jid ? lt_job_get(lt_proj_jobs(p->proj), jid) : NULL;
  JLOG(jid ? jid : "",
       "job %s: checkpoint commit (attempt %d, step %" PRId64 ") at %s/%d@%" PRId64
       ": %s (job at attempt %d, checkpoint %d/%" PRId64 ")",
       jid ? jid : "?", (int)attempt, step, res->origin.tag == T_CONTROL ? "control" : "other",
       (int)res->origin.partition, res->origin.offset,
       res->job_outcome == LT_JOB_APPLIED ? "applied" : "not applied", j ? (int)j->attempt : -1,
       j ? (int)j->ckpt_attempt : -1, j ? j->ckpt_step : (int64_t)-1);
}

/* Every record the fold applied, in log order across topics (lt_proj_fold keeps a job's records
 * aside until its JobSubmitted is folded): note checkpoints and completions to promote. */
static void on_folded(void *ctx, const lt_proj_result_t *res) {
  lt_publisher_t *p = ctx;
  p->stats.folded++;
  if (res->type && strcmp(res->type, "CheckpointCommitted") == 0) log_commit(p, res);
  if (!res->type || res->job_outcome != LT_JOB_APPLIED) return;
  const char *jid = NULL;
  lt_avro_get_string(res->record, "job_id", &jid, NULL);
  if (!jid) return;
  char job_id[LT_ID_MAX + 1];
  snprintf(job_id, sizeof job_id, "%s", jid);
  bool control = res->origin.tag == T_CONTROL;
  int32_t partition = res->origin.partition;
  int64_t offset = res->origin.offset;
  if (strcmp(res->type, "CheckpointCommitted") == 0) {
    const char *ev = NULL;
    lt_avro_get_string(res->record, "event_id", &ev, NULL);
    json_object_set_new(p->ckpt_ev, job_id, json_string(ev ? ev : ""));
    note_checkpoint(p, job_id, lt_proj_job_info(p->proj, job_id));
  } else if (strcmp(res->type, "JobDispatched") == 0) {
    check_resume(p, job_id, res->record, lt_proj_job_info(p->proj, job_id));
  } else if (strcmp(res->type, "JobCompleted") == 0) {
    const char *cev = NULL, *csha = NULL;
    lt_avro_get_string(res->record, "checkpoint_event_id", &cev, NULL);
    lt_avro_get_string(res->record, "checkpoint_sha256", &csha, NULL);
    json_object_set_new(p->done_ev, job_id, json_pack("{s:s,s:s}", "checkpoint_event_id", cev ? cev : "",
                                                      "checkpoint_sha256", csha ? csha : ""));
    const lt_job_t *j = lt_job_get(lt_proj_jobs(p->proj), job_id);
    /* Completions below the group's committed offset were handled by an earlier instance. */
    if (j && j->state == LT_JOB_COMPLETED && control && offset >= p->ctrl_start[partition])
      todo_add(p, job_id, partition, offset, res->message, res->message_len);
  }
}

/* Folds a consumed message (m) or, m NULL, a record this publisher wrote (v, len). */
static void fold_msg(lt_publisher_t *p, const lt_bus_msg_t *m, const void *v, size_t len, bool control,
                     int32_t partition, int64_t offset) {
  lt_proj_origin_t origin = {.partition = partition, .offset = offset, .tag = control ? T_CONTROL : -1};
  char err[512];
  /* The scheduler dead-letters undecodable control records and refused tenant records; the
   * publisher skips and counts them (a refused tenant keeps its previous state). */
  lt_err_t e = m ? lt_proj_fold_msg(p->proj, m, &origin, on_folded, p, err, sizeof err)
                 : lt_proj_fold_at(p->proj, v, len, &origin, on_folded, p, err, sizeof err);
  if (e == LT_ERR_AUTH) lt_log_error("publisher", "%s", err);
  if (e) p->stats.undecodable++;
}

/* ---------------------------------------------------------------- records we write */

/* A name-based UUID (version 8 layout) of job and checkpoint: the same promotion always carries
 * the same event_id, so a repeated publication is recognisably the same event. */
static void publication_event_id(const char *job_id, const char *ckpt_event_id, char out[37]) {
  uint8_t d[32];
  char buf[256];
  int n = snprintf(buf, sizeof buf, "lathe.ArtifactPublished\n%s\n%s", job_id, ckpt_event_id);
  lt_crypto_sha256(buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1), d);
  d[6] = (uint8_t)((d[6] & 0x0f) | 0x80);
  d[8] = (uint8_t)((d[8] & 0x3f) | 0x80);
  char hex[33];
  lt_crypto_hex(d, 16, hex);
  snprintf(out, 37, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
}

static lt_err_t produce(lt_publisher_t *p, const char *topic, const char *key, const void *v, size_t len, char *errstr,
                        size_t n) {
  lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = key, .key_size = strlen(key),
                       .value = v, .value_size = len};
  return lt_bus_produce_sync(p->producer, &r, p->conf.produce_timeout_ms, NULL, NULL, errstr, n);
}

static void dead_letter(lt_publisher_t *p, const todo_t *t, lt_err_t code, const char *reason) {
  char err[256];
  lt_avro_record_t *rec = NULL;
  const uint8_t *bytes;
  size_t len;
  uint64_t fp = 0;
  char fph[17] = "";
  if (t->payload && lt_avro_peek(t->payload, t->len, &fp, NULL, 0) == LT_OK) lt_avro_fingerprint_hex(fp, fph);
  lt_err_t e = lt_avro_record_new(p->conf.registry, "DeadLetter", &rec, err, sizeof err);
  if (!e && (lt_avro_record_stamp(rec, p->producer_id) || lt_avro_set_string(rec, "topic", p->topics[T_CONTROL]) ||
             lt_avro_set_int(rec, "partition", t->partition) || lt_avro_set_long(rec, "offset", t->offset) ||
             lt_avro_set_bytes(rec, "key", t->job_id, strlen(t->job_id)) ||
             lt_avro_set_bytes(rec, "payload", t->payload ? t->payload : "", t->len) ||
             (fph[0] ? lt_avro_set_string(rec, "fingerprint", fph) : lt_avro_set_null(rec, "fingerprint")) ||
             lt_avro_set_string(rec, "error_code", lt_err_name(code)) || lt_avro_set_string(rec, "reason", reason) ||
             lt_avro_set_string(rec, "consumer", p->group))) {
    snprintf(err, sizeof err, "%s", lt_avro_record_error(rec));
    e = LT_ERR_INTERNAL;
  }
  if (!e) e = lt_avro_record_encode(rec, &bytes, &len, err, sizeof err);
  if (!e) e = produce(p, p->deadletter, t->job_id, bytes, len, err, sizeof err);
  if (e) JWARN(t->job_id, "job %s: DeadLetter not written: %s", t->job_id, err);
  lt_avro_record_destroy(rec);
}

static lt_err_t publish_record(lt_publisher_t *p, const lt_job_t *j, const char *ckpt_ev,
                               const lt_publisher_promotion_t *pr, char *errstr, size_t n) {
  lt_avro_record_t *rec = NULL;
  const uint8_t *bytes;
  size_t len;
  char evid[37];
  publication_event_id(j->job_id, ckpt_ev, evid);
  lt_err_t err = lt_avro_record_new(p->conf.registry, "ArtifactPublished", &rec, errstr, n);
  if (err) return err;
  bool bad = lt_avro_record_stamp(rec, p->producer_id) || lt_avro_set_string(rec, "event_id", evid) ||
             lt_avro_set_string(rec, "job_id", j->job_id) || lt_avro_set_string(rec, "tenant_id", j->tenant_id) ||
             lt_avro_set_int(rec, "attempt", j->attempt) || lt_avro_set_string(rec, "checkpoint_event_id", ckpt_ev) ||
             lt_avro_set_string(rec, "config_digest", pr->config_digest);
  for (size_t i = 0; !bad && i < pr->n; i++) {
    char path[64];
    size_t ix;
    bad = lt_avro_array_append(rec, "artifacts", &ix) != LT_OK;
#define SETF(field, call)                                                                                              \
  (snprintf(path, sizeof path, "artifacts[%zu]." field, ix), call)
    bad = bad || SETF("name", lt_avro_set_string(rec, path, pr->artifacts[i].name)) ||
          SETF("key", lt_avro_set_string(rec, path, pr->artifacts[i].key)) ||
          SETF("sha256", lt_avro_set_string(rec, path, pr->artifacts[i].sha256)) ||
          SETF("bytes", lt_avro_set_long(rec, path, (int64_t)pr->artifacts[i].bytes));
#undef SETF
  }
  if (bad) err = lt_errf(errstr, n, LT_ERR_INTERNAL, "ArtifactPublished: %s", lt_avro_record_error(rec));
  if (!err) err = lt_avro_record_encode(rec, &bytes, &len, errstr, n);
  if (!err) err = produce(p, p->topics[T_ARTIFACTS], j->job_id, bytes, len, errstr, n);
  /* Durable now: fold it at once, so this instance never promotes the job again. */
  if (!err) fold_msg(p, NULL, bytes, len, false, 0, 0);
  lt_avro_record_destroy(rec);
  return err;
}

/* ---------------------------------------------------------------- promotion of one job */

typedef enum { DONE, RETRY } step_t;

static step_t reject(lt_publisher_t *p, todo_t *t, lt_err_t code, const char *why) {
  JWARN(t->job_id, "job %s: not published: %s", t->job_id, why);
  p->stats.rejected++;
  set_last(p, code, why);
  dead_letter(p, t, code, why);
  return DONE;
}

static step_t retry(lt_publisher_t *p, todo_t *t, lt_err_t code, const char *why) {
  int64_t delay = 500;
  for (int i = 0; i < t->tries && delay < p->conf.retry_max_ms; i++) delay *= 2;
  if (delay > p->conf.retry_max_ms) delay = p->conf.retry_max_ms;
  t->tries++;
  t->next_ms = lt_time_wall_ms() + delay;
  p->stats.retries++;
  set_last(p, code, why);
  JWARN(t->job_id, "job %s: promotion postponed %" PRId64 " ms (try %d): %s", t->job_id, delay, t->tries, why);
  return RETRY;
}

static const char *jstr(json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}

lt_err_t lt_publisher_artifact_dek(const lt_crypto_dek_t *tenant_dek, const char *job, lt_crypto_dek_t **out,
                                   char *errstr, size_t n) {
  char label[LT_ID_MAX + 32];
  if (!component_ok(job) || strlen(job) > LT_ID_MAX)
    return lt_errf(errstr, n, LT_ERR_INVALID, "job id '%.80s' cannot name an artifact key", job ? job : "");
  snprintf(label, sizeof label, "lathe artifact key\n%s", job);
  return lt_crypto_dek_derive(tenant_dek, label, job, out, errstr, n);
}

/* The job's artifact key: unwrapped from its key.wrapped, or made and stored there first (before
 * any artifact is sealed with it). Made, it is derived (lt_publisher_artifact_dek), never drawn at
 * random: two publishers that promote one completion at once both write key.wrapped and the last
 * write wins, so both must have sealed their artifacts under the same key. *out is the caller's. */
static lt_err_t job_dek(lt_publisher_t *p, const lt_crypto_dek_t *tenant_dek, const char *tenant, const char *job,
                        lt_crypto_dek_t **out, char *why, size_t n) {
  char key[LT_STORE_KEY_MAX + 1];
  lt_err_t err = lt_publisher_artifact_dek_key(key, sizeof key, tenant, job);
  void *blob = NULL;
  size_t len = 0;
  if (!err) err = lt_store_get(p->conf.store, key, LT_CRYPTO_WRAPPED_MAX, &blob, &len, NULL, why, n);
  if (!err) err = lt_crypto_dek_unwrap(p->conf.kek, tenant, blob, len, out, why, n);
  free(blob);
  if (err != LT_ERR_NOT_FOUND) return err;
  uint8_t wrapped[LT_CRYPTO_WRAPPED_MAX];
  err = lt_publisher_artifact_dek(tenant_dek, job, out, why, n);
  if (!err) err = lt_crypto_dek_wrap(p->conf.kek, *out, wrapped, sizeof wrapped, &len, why, n);
  if (!err) err = lt_store_put(p->conf.store, key, wrapped, len, NULL, why, n);
  if (err) {
    lt_crypto_dek_destroy(*out);
    *out = NULL;
  }
  return err;
}

static step_t promote_job(lt_publisher_t *p, todo_t *t) {
  char why[512];
  const lt_job_t *j = lt_job_get(lt_proj_jobs(p->proj), t->job_id);
  if (!j || j->state != LT_JOB_COMPLETED) return DONE; /* terminal states do not change: cannot happen */
  json_t *info = lt_proj_job_info(p->proj, t->job_id);
  if (json_object_get(info, "deleted")) { /* by its tenant: nothing of it is published, or refused */
    JLOG(t->job_id, "job %s: deleted by its tenant: not published", t->job_id);
    return DONE;
  }
  json_t *ck = info ? json_object_get(info, "checkpoint") : NULL;
  const char *ck_ev = json_string_value(json_object_get(p->ckpt_ev, t->job_id));
  if (!ck || !ck_ev || !j->ckpt_final || j->ckpt_attempt != j->attempt ||
      json_integer_value(json_object_get(ck, "attempt")) != j->attempt || !json_is_true(json_object_get(ck, "final"))) {
    snprintf(why, sizeof why, "job completed without a committed final checkpoint of its attempt %d", (int)j->attempt);
    return reject(p, t, LT_ERR_INVALID, why);
  }
  json_t *done = json_object_get(p->done_ev, t->job_id);
  const char *cev = jstr(done, "checkpoint_event_id"), *csha = jstr(done, "checkpoint_sha256");
  if (*cev && strcmp(cev, ck_ev) != 0) {
    snprintf(why, sizeof why, "JobCompleted names checkpoint %s but the newest committed final checkpoint is %s", cev,
             ck_ev);
    return reject(p, t, LT_ERR_INVALID, why);
  }
  if (*csha && strcmp(csha, jstr(ck, "sha256")) != 0) {
    snprintf(why, sizeof why, "JobCompleted says checkpoint sha256 %s, the commit says %s", csha, jstr(ck, "sha256"));
    return reject(p, t, LT_ERR_CORRUPT, why);
  }
  json_t *pub = json_object_get(info, "published");
  if (pub) {
    if (strcmp(jstr(pub, "checkpoint_event_id"), ck_ev) != 0)
      JLOG(t->job_id, "job %s: already published from checkpoint %s; never again from %s", t->job_id,
          jstr(pub, "checkpoint_event_id"), ck_ev);
    p->stats.already_published++;
    return DONE;
  }
  const lt_tenant_t *tenant = lt_tenant_get(lt_proj_tenants(p->proj), j->tenant_id);
  if (!tenant) {
    snprintf(why, sizeof why, "tenant %s is not in lathe.tenants (yet)", j->tenant_id);
    return retry(p, t, LT_ERR_NOT_FOUND, why);
  }
  const lt_crypto_dek_t *dek = NULL;
  lt_err_t err = lt_keyring_tenant_dek(p->keyring, tenant, &dek, why, sizeof why);
  if (err) return reject(p, t, err, why);

  json_t *keys = json_object_get(ck, "object_keys");
  const char *kv[LT_PUBLISHER_MAX_OBJECTS];
  size_t nk = json_array_size(keys);
  if (nk > LT_PUBLISHER_MAX_OBJECTS) nk = LT_PUBLISHER_MAX_OBJECTS + 1;
  for (size_t i = 0; i < nk && i < LT_PUBLISHER_MAX_OBJECTS; i++) kv[i] = json_string_value(json_array_get(keys, i));
  lt_publisher_checkpoint_t c = {.tenant_id = j->tenant_id,
                                 .job_id = j->job_id,
                                 .attempt = j->attempt,
                                 .step = json_integer_value(json_object_get(ck, "step")),
                                 .object_keys = kv,
                                 .nkeys = nk,
                                 .sha256_hex = jstr(ck, "sha256"),
                                 .bytes = (uint64_t)json_integer_value(json_object_get(ck, "bytes"))};
  /* Only what the checkpoint or its key is refuses it for good (a key that does not unwrap; the
   * checkpoint's hashes, sealing or layout, a staged object missing); the store's own failures (a
   * 403 while credentials rotate, a status it does not class) are tried again, with back-off:
   * refused, the job stayed COMPLETED with no artifacts for ever. */
  lt_crypto_dek_t *adek = NULL;
  if ((err = job_dek(p, dek, j->tenant_id, j->job_id, &adek, why, sizeof why)))
    return err == LT_ERR_CORRUPT || err == LT_ERR_INVALID ? reject(p, t, err, why) : retry(p, t, err, why);
  c.artifact_dek = adek;
  lt_publisher_promotion_t *pr = malloc(sizeof *pr);
  if (!pr) {
    lt_crypto_dek_destroy(adek);
    return retry(p, t, LT_ERR_NOMEM, "out of memory");
  }
  err = lt_publisher_promote(p->conf.store, dek, &c, p->conf.max_checkpoint_bytes, pr, why, sizeof why);
  lt_crypto_dek_destroy(adek);
  step_t st;
  if (err) {
    /* A staged object missing is refused for good, but at the fourth try (3.5 s on): a DELETE of
     * the job removes its objects once its JobDeleted is on the log, which this fold may not have
     * read yet; a later try finds the job deleted, and no dead letter tells of a customer's delete. */
    bool for_good = err == LT_ERR_CORRUPT || err == LT_ERR_INVALID || (err == LT_ERR_NOT_FOUND && t->missing++ >= 3);
    st = for_good ? reject(p, t, err, why) : retry(p, t, err, why);
  } else {
    /* j points into the job table, which the fold in publish_record may grow: copy what it needs. */
    lt_job_t jc = *j;
    char ev[128];
    snprintf(ev, sizeof ev, "%s", ck_ev);
    err = publish_record(p, &jc, ev, pr, why, sizeof why);
    if (err) {
      st = retry(p, t, err, why);
    } else {
      p->stats.published++;
      JLOG(jc.job_id, "job %s: published %zu artifacts from checkpoint %s (attempt %d, step %" PRId64 ")", jc.job_id,
           pr->n, ev,
          (int)jc.attempt, c.step);
      trim_checkpoints(p, jc.job_id); /* a session's saved states go with its end */
      prune_job(p, jc.tenant_id, jc.job_id);
      st = DONE;
    }
  }
  free(pr);
  return st;
}

/* Commits lathe.control up to the oldest completion still waiting (or everything folded). */
static void commit_offsets(lt_publisher_t *p) {
  lt_bus_tp_t tp[256];
  size_t n = 0;
  for (int i = 0; i < p->ncontrol && n < 256; i++) {
    int64_t off = p->ctrl_pos[i];
    if (off < 0) continue;
    for (size_t k = 0; k < p->ntodo; k++)
      if (p->todo[k].partition == i && p->todo[k].offset < off) off = p->todo[k].offset;
    if (off > p->ctrl_committed[i]) tp[n++] = (lt_bus_tp_t){.topic = p->topics[T_CONTROL], .partition = i, .offset = off};
  }
  if (!n) return;
  char err[256];
  if (lt_bus_consumer_commit(p->consumer, tp, n, false, err, sizeof err) != LT_OK) {
    WARN("offset commit failed (will retry): %s", err);
    return;
  }
  for (size_t k = 0; k < n; k++) p->ctrl_committed[tp[k].partition] = tp[k].offset;
}

static void work(lt_publisher_t *p) {
  if (!p->stats.ready || p->in_work) return;
  p->in_work = true;
  int64_t now = lt_time_wall_ms();
  for (size_t i = 0; i < p->ntodo;) {
    todo_t *t = &p->todo[i];
    if (t->next_ms > now || promote_job(p, t) == RETRY) {
      i++;
      continue;
    }
    todo_remove(p, i);
  }
  commit_offsets(p);
  p->in_work = false;
}

/* ---------------------------------------------------------------- catch-up and the loop */

static void check_ready(lt_publisher_t *p) {
  if (p->stats.ready) return;
  int64_t now = lt_time_wall_ms();
  bool ok = true;
  lt_bus_tp_t *pos = malloc(p->nparts * sizeof *pos);
  if (pos) {
    memcpy(pos, p->parts, p->nparts * sizeof *pos);
    if (lt_bus_consumer_position(p->consumer, pos, p->nparts, NULL, 0) != LT_OK) ok = false;
    for (size_t i = 0; ok && i < p->nparts; i++)
      if (p->high[i] > p->low[i] && (pos[i].offset < 0 || pos[i].offset < p->high[i])) ok = false;
    free(pos);
  } else {
    ok = false;
  }
  /* A partition that ends in transaction markers never reaches its high watermark through the
   * records we are given: a quiet consumer counts as caught up too. */
  int64_t quiet_since = p->last_record_ms > p->started_ms ? p->last_record_ms : p->started_ms;
  if (!ok && now - quiet_since < p->conf.settle_ms) return;
  p->stats.ready = true;
  if (p->conf.gc_interval_ms > 0) p->next_gc_ms = now + p->conf.gc_interval_ms;
  LOG("caught up (%" PRIu64 " records folded, %zu completions to check)", p->stats.folded, p->ntodo);
}

static void feed(lt_publisher_t *p) {
  bool more = false;
  for (int i = 0; i < 2000; i++) {
    const lt_bus_msg_t *m = NULL;
    char err[256];
    if (lt_bus_consumer_poll(p->consumer, 0, &m, err, sizeof err) != LT_OK) {
      WARN("consumer: %s", err);
      break;
    }
    if (!m) break;
    if (i == 1999) more = true;
    p->last_record_ms = lt_time_wall_ms();
    const char *topic = lt_bus_msg_topic(m);
    int32_t part = lt_bus_msg_partition(m);
    int64_t off = lt_bus_msg_offset(m);
    bool control = strcmp(topic, p->topics[T_CONTROL]) == 0 && part >= 0 && part < p->ncontrol;
    if (control) p->ctrl_pos[part] = off + 1;
    fold_msg(p, m, NULL, 0, control, part, off);
  }
  check_ready(p);
  work(p);
  if (more) event_active(p->consumer_ev, EV_READ, 0);
}

static void on_consumer(evutil_socket_t fd, short what, void *arg) { feed(arg); }

static void on_tick(evutil_socket_t fd, short what, void *arg) {
  lt_publisher_t *p = arg;
  feed(p);
  if (p->consumer) { /* a partition's fetcher may stop, before its first record too: lt_bus.h */
    size_t healed = 0;
    char err[256];
    if (lt_bus_consumer_heal_stalls(p->consumer, 10000, 500, &healed, err, sizeof err) == LT_OK && healed)
      WARN("%zu partition(s) stood still behind the log for 10 s: fetching them again", healed);
  }
  if (p->stats.ready && p->conf.gc_interval_ms > 0 && lt_time_wall_ms() >= p->next_gc_ms) {
    char err[256];
    uint64_t n = 0;
    if (lt_publisher_gc(p, &n, err, sizeof err) != LT_OK) WARN("gc: %s", err);
    p->next_gc_ms = lt_time_wall_ms() + p->conf.gc_interval_ms;
  }
}

/* ---------------------------------------------------------------- garbage collection */

typedef enum { GC_STAGING, GC_SESSIONS, GC_ARTIFACTS, GC__KINDS } gc_kind_t;

typedef struct {
  lt_publisher_t *p;
  size_t plen;  /* length of the prefix walked: "staging/<tenant>/", "sessions/<tenant>/", ... */
  gc_kind_t kind; /* staging, a session's call bodies and results, or published artifacts */
  int64_t now_ms;
  json_t *doomed;
  uint64_t kept;
} gc_ctx_t;

static bool named_by_checkpoint(json_t *info, const char *key) {
  json_t *keys = info ? json_object_get(info, "checkpoint_keys") : NULL;
  size_t i;
  json_t *k;
  json_array_foreach(keys, i, k) if (json_is_string(k) && strcmp(json_string_value(k), key) == 0) return true;
  return false;
}

/* Is the staging object at rest ("/<attempt>/<step>/<name>") of live job j possibly part of a
 * checkpoint whose commit this publisher has not folded yet: the current attempt (or a newer one)
 * past the newest commit folded? Its commit may land any time (a worker partitioned between upload
 * and commit, or this publisher lagging on lathe.control), so only the job's end makes it garbage. */
static bool maybe_uncommitted(const lt_job_t *j, const char *rest) {
  int attempt = 0;
  long long step = 0;
  if (!rest || sscanf(rest, "/%d/%lld/", &attempt, &step) != 2) return false;
  if (attempt < j->attempt) return false; /* a fenced attempt's */
  return attempt != j->ckpt_attempt || step > j->ckpt_step;
}

/* A published artifact stays unless its job was deleted: a publisher that was promoting the job
 * while its tenant's DELETE removed the job's objects wrote them (and the job's key) again after
 * it. They go at once, whatever their age — no upload of a deleted job is on its way — the
 * wrapped key before the rest of its page, as the DELETE does. An artifact of a job not folded
 * yet is kept. */
static void gc_visit_artifact(gc_ctx_t *g, const char *job, const char *key) {
  json_t *jinfo = lt_job_get(lt_proj_jobs(g->p->proj), job) ? lt_proj_job_info(g->p->proj, job) : NULL;
  const char *name = strrchr(key, '/');
  if (!json_object_get(jinfo, "deleted"))
    return; /* kept: not counted, gc_kept counts staging objects */
  if (name && strcmp(name + 1, "key.wrapped") == 0)
    json_array_insert_new(g->doomed, 0, json_string(key));
  else
    json_array_append_new(g->doomed, json_string(key));
}

static lt_err_t gc_visit(void *ctx, const char *key, const lt_store_info_t *info) {
  gc_ctx_t *g = ctx;
  int64_t grace = g->p->conf.gc_grace_ms;
  char job[LT_ID_MAX + 1];
  const char *s = key + g->plen, *slash = strchr(s, '/');
  size_t jl = slash ? (size_t)(slash - s) : strlen(s);
  if (jl >= sizeof job) jl = sizeof job - 1;
  memcpy(job, s, jl);
  job[jl] = '\0';
  if (g->kind == GC_ARTIFACTS) {
    gc_visit_artifact(g, job, key);
    return LT_OK;
  }
  const lt_job_t *j = lt_job_get(lt_proj_jobs(g->p->proj), job);
  json_t *jinfo = j ? lt_proj_job_info(g->p->proj, job) : NULL;
  bool keep = false;
  if (json_object_get(jinfo, "deleted")) /* by its tenant: nothing of it stays, however young (a */
    keep = false;                         /* cancelled session's last result, written after it) */
  else if (g->now_ms - info->mtime * 1000 < grace)
    keep = true; /* young: a checkpoint may be uploading, its commit not yet written */
  else if (!j) /* not folded yet: only a dispatched job has staging, only a known session calls, so
                * its records are on their way (this publisher lags on a topic: chaos seed 2001) */
    keep = true;
  else if (g->kind == GC_SESSIONS) /* a session's calls and results: kept while it lives, then for the grace */
    keep = !lt_job_state_is_terminal(j->state) || g->now_ms - j->ended_at_ms < grace;
  else if (!lt_job_state_is_terminal(j->state))
    keep = named_by_checkpoint(jinfo, key) || retained(g->p, job, key) || maybe_uncommitted(j, slash);
  else if (j->state == LT_JOB_COMPLETED)
    keep = named_by_checkpoint(jinfo, key) || retained(g->p, job, key);
  else
    keep = g->now_ms - j->ended_at_ms < grace; /* cancelled, failed, rejected: after the grace */
  if (keep) g->kept++;
  else json_array_append_new(g->doomed, json_string(key));
  return LT_OK;
}

lt_err_t lt_publisher_gc(lt_publisher_t *p, uint64_t *deleted, char *errstr, size_t n) {
  if (deleted) *deleted = 0;
  if (!p->stats.ready) return lt_errf(errstr, n, LT_ERR_RETRIABLE, "not caught up with the topics yet");
  gc_ctx_t g = {.p = p, .now_ms = lt_time_wall_ms()};
  lt_err_t err = LT_OK;
  uint64_t count = 0;
  lt_tenant_table_t *tt = lt_proj_tenants(p->proj);
  for (size_t ti = 0; !err && ti < GC__KINDS * lt_tenant_count(tt); ti++) {
    char prefix[LT_STORE_KEY_MAX + 1], next[LT_STORE_KEY_MAX + 1] = "", after[LT_STORE_KEY_MAX + 1] = "";
    const char *tenant = lt_tenant_at(tt, ti / GC__KINDS)->tenant_id;
    g.kind = (gc_kind_t)(ti % GC__KINDS);
    if (g.kind == GC_ARTIFACTS)
      snprintf(prefix, sizeof prefix, "tenants/%s/artifacts/", tenant);
    else
      snprintf(prefix, sizeof prefix, "%s/%s/", g.kind == GC_SESSIONS ? "sessions" : "staging", tenant);
    g.plen = strlen(prefix);
    do {
      g.doomed = json_array();
      err = lt_store_list(p->conf.store, prefix, after, 0, gc_visit, &g, next, sizeof next, errstr, n);
      size_t i;
      json_t *k;
      json_array_foreach(g.doomed, i, k) {
        if (err) break;
        err = lt_store_delete(p->conf.store, json_string_value(k), errstr, n);
        if (!err) {
          count++;
          LOG("gc: deleted %s", json_string_value(k));
        }
      }
      json_decref(g.doomed);
      snprintf(after, sizeof after, "%s", next);
    } while (!err && next[0]);
  }
  /* and each tenant's datasets that a crash left without their meta or key */
  lt_dataset_sweep_conf_t sweep = {
      .now_ms = g.now_ms, .grace_ms = p->conf.gc_grace_ms, .suspects = p->dataset_suspects, .pass = ++p->gc_passes};
  for (size_t ti = 0; !err && ti < lt_tenant_count(tt); ti++) {
    uint64_t swept = 0, young = 0;
    err = lt_dataset_sweep(p->conf.store, lt_tenant_at(tt, ti)->tenant_id, &sweep, &swept, &young, errstr, n);
    if (swept) LOG("gc: deleted %" PRIu64 " objects of tenant %s's datasets that never came to exist", swept,
                   lt_tenant_at(tt, ti)->tenant_id);
    p->stats.datasets_swept += swept;
    g.kept += young;
  }
  if (!err) lt_dataset_sweep_forget(p->dataset_suspects, sweep.pass);
  p->stats.gc_deleted += count;
  p->stats.gc_kept = g.kept;
  if (deleted) *deleted = count;
  return err;
}

/* ---------------------------------------------------------------- construction */

static lt_err_t start_consumer(lt_publisher_t *p, char *errstr, size_t n) {
  lt_bus_admin_t *admin = NULL;
  lt_err_t err = lt_bus_admin_new(p->conf.bus, &admin, errstr, n);
  if (err) return err;
  int counts[T__COUNT] = {0};
  size_t total = 0;
  for (int b = 0; b < T__COUNT && !err; b++) {
    err = lt_bus_admin_describe_topic(admin, p->topics[b], 10000, &counts[b], errstr, n);
    total += (size_t)counts[b];
  }
  lt_bus_admin_destroy(admin);
  if (err) return err;
  p->ncontrol = counts[T_CONTROL];
  /* One block: the partitions, then low and high of each, then the three lathe.control offset
   * arrays; lt_publisher_destroy frees it as p->parts. */
  size_t nctl = (size_t)p->ncontrol;
  p->parts = calloc(1, total * sizeof *p->parts + (2 * total + 3 * nctl) * sizeof(int64_t));
  if (!p->parts) return LT_ERR_NOMEM;
  p->low = (int64_t *)(p->parts + total);
  p->high = p->low + total;
  p->ctrl_start = p->high + total;
  p->ctrl_pos = p->ctrl_start + nctl;
  p->ctrl_committed = p->ctrl_pos + nctl;
  for (int b = 0; b < T__COUNT; b++)
    for (int i = 0; i < counts[b]; i++)
      p->parts[p->nparts++] = (lt_bus_tp_t){.topic = p->topics[b], .partition = i, .offset = LT_BUS_OFFSET_BEGINNING};

  lt_bus_consumer_opts_t copts = {.group_id = p->group};
  if ((err = lt_bus_consumer_new(p->conf.bus, &copts, &p->consumer, errstr, n))) return err;

  /* Where the group stopped on lathe.control: completions before it were handled. */
  lt_bus_tp_t *ctl = p->parts + counts[T_JOBS];
  lt_bus_tp_t committed[256];
  int nc = p->ncontrol < 256 ? p->ncontrol : 256;
  memcpy(committed, ctl, (size_t)nc * sizeof *committed);
  if ((err = lt_bus_consumer_committed(p->consumer, committed, (size_t)nc, 10000, errstr, n))) return err;
  for (int i = 0; i < p->ncontrol; i++) {
    p->ctrl_start[i] = i < nc && committed[i].offset >= 0 ? committed[i].offset : 0;
    p->ctrl_committed[i] = p->ctrl_start[i];
    p->ctrl_pos[i] = -1;
  }
  /* The end of every partition as of now: caught up means folded up to there. */
  lt_bus_tp_t *hw = malloc(p->nparts * sizeof *hw);
  if (!hw) return LT_ERR_NOMEM;
  memcpy(hw, p->parts, p->nparts * sizeof *hw);
  err = lt_bus_consumer_watermarks(p->consumer, hw, p->nparts, p->low, 10000, errstr, n);
  for (size_t i = 0; !err && i < p->nparts; i++) p->high[i] = hw[i].offset;
  free(hw);
  if (err) return err;
  if ((err = lt_bus_consumer_assign(p->consumer, p->parts, p->nparts, errstr, n))) return err;
  p->consumer_ev = event_new(p->base, lt_bus_consumer_fd(p->consumer), EV_READ | EV_PERSIST, on_consumer, p);
  p->tick_ev = event_new(p->base, -1, EV_PERSIST, on_tick, p);
  struct timeval tv = {p->conf.tick_ms / 1000, (p->conf.tick_ms % 1000) * 1000};
  if (!p->consumer_ev || !p->tick_ev || event_add(p->consumer_ev, NULL) || event_add(p->tick_ev, &tv))
    return lt_errf(errstr, n, LT_ERR_NOMEM, "cannot register the publisher's events");
  return LT_OK;
}

lt_err_t lt_publisher_new(struct event_base *base, const lt_publisher_conf_t *conf, lt_publisher_t **out, char *errstr,
                          size_t n) {
  if (!base || !conf || !conf->bus || !conf->store || !conf->kek || !conf->registry)
    return lt_errf(errstr, n, LT_ERR_INVALID, "publisher: base, bus, store, kek and registry are required");
  lt_publisher_t *p = calloc(1, sizeof *p);
  if (!p) return LT_ERR_NOMEM;
  p->base = base;
  p->conf = *conf;
  snprintf(p->producer_id, sizeof p->producer_id, "%s", conf->producer_id ? conf->producer_id : "publisher");
  /* One group per deployment (topic prefix): publishers of another prefix on the same broker
   * must not share its offsets or rebalances. */
  if (conf->group_id) snprintf(p->group, sizeof p->group, "%s", conf->group_id);
  else lt_bus_topic_name(conf->bus, "publisher", p->group, sizeof p->group);
  p->conf.producer_id = p->producer_id;
  p->conf.group_id = p->group;
  if (p->conf.gc_grace_ms <= 0) p->conf.gc_grace_ms = 3600 * 1000;
  if (p->conf.gc_interval_ms == 0) p->conf.gc_interval_ms = p->conf.gc_grace_ms < 60000 ? p->conf.gc_grace_ms : 60000;
  if (p->conf.tick_ms <= 0) p->conf.tick_ms = 200;
  if (p->conf.produce_timeout_ms <= 0) p->conf.produce_timeout_ms = 15000;
  if (p->conf.retry_max_ms <= 0) p->conf.retry_max_ms = 60000;
  if (p->conf.max_checkpoint_bytes == 0) p->conf.max_checkpoint_bytes = 1ull << 30;
  if (p->conf.settle_ms <= 0) p->conf.settle_ms = 2000;
  if (p->conf.keep_checkpoints == 0) p->conf.keep_checkpoints = 2;
  for (int b = 0; b < T__COUNT; b++) lt_bus_topic_name(conf->bus, bases[b], p->topics[b], sizeof p->topics[b]);
  lt_bus_topic_name(conf->bus, "deadletter", p->deadletter, sizeof p->deadletter);
  p->ckpt_ev = json_object();
  p->done_ev = json_object();
  p->ckpt_dirs = json_object();
  p->dataset_suspects = lt_map_new(NULL);
  p->started_ms = lt_time_wall_ms();
  lt_err_t err = p->ckpt_ev && p->done_ev && p->ckpt_dirs && p->dataset_suspects ? LT_OK : LT_ERR_NOMEM;
  if (!err) err = lt_proj_new(conf->registry, &p->proj, errstr, n);
  if (!err && conf->tenant_mac) lt_proj_require_tenant_mac(p->proj, conf->tenant_mac);
  if (!err) err = lt_keyring_new(conf->kek, &p->keyring);
  if (!err) err = lt_bus_producer_new(conf->bus, NULL, &p->producer, errstr, n);
  if (!err) lt_bus_producer_prepare(p->producer, p->topics[T_CONTROL], 2000);
  if (!err) err = start_consumer(p, errstr, n);
  if (err) {
    lt_publisher_destroy(p);
    return err;
  }
  *out = p;
  return LT_OK;
}

void lt_publisher_stats(const lt_publisher_t *p, lt_publisher_stats_t *out) {
  *out = p->stats;
  out->waiting = p->ntodo;
}

char *lt_publisher_metrics(lt_publisher_t *p) {
  lt_publisher_stats_t st;
  lt_publisher_stats(p, &st);
  lt_metrics_t *m = lt_metrics_new();
  lt_metrics_one(m, "lathe_publisher_ready", LT_METRIC_GAUGE, "1 once caught up with the topics as of start-up.",
                 st.ready);
  lt_metrics_one(m, "lathe_publisher_records_folded_total", LT_METRIC_COUNTER, "Records folded.", (double)st.folded);
  lt_metrics_one(m, "lathe_publisher_undecodable_records_total", LT_METRIC_COUNTER,
                 "Records the fold refused (skipped).", (double)st.undecodable);
  lt_metrics_family(m, "lathe_publisher_completions_total", LT_METRIC_COUNTER,
                    "Completed jobs checked for promotion, by outcome: published now, found already published "
                    "from the same checkpoint, or refused for good (SHA, decryption, layout).");
  lt_metrics_sample(m, (lt_metric_label_t[]){{"outcome", "published"}, {0}}, (double)st.published);
  lt_metrics_sample(m, (lt_metric_label_t[]){{"outcome", "already_published"}, {0}}, (double)st.already_published);
  lt_metrics_sample(m, (lt_metric_label_t[]){{"outcome", "rejected"}, {0}}, (double)st.rejected);
  lt_metrics_one(m, "lathe_publisher_artifacts_published_total", LT_METRIC_COUNTER,
                 "ArtifactPublished records this instance wrote.", (double)st.published);
  lt_metrics_one(m, "lathe_publisher_retries_total", LT_METRIC_COUNTER,
                 "Promotions postponed by a retriable error (the store down).", (double)st.retries);
  lt_metrics_one(m, "lathe_publisher_completions_waiting", LT_METRIC_GAUGE, "Completions waiting to be promoted.",
                 (double)st.waiting);
  lt_metrics_family(m, "lathe_publisher_staging_deleted_objects_total", LT_METRIC_COUNTER,
                    "Staging objects deleted: by the garbage collector, or by retention at completion.");
  lt_metrics_sample(m, (lt_metric_label_t[]){{"by", "gc"}, {0}}, (double)st.gc_deleted);
  lt_metrics_sample(m, (lt_metric_label_t[]){{"by", "retention"}, {0}}, (double)st.pruned);
  lt_metrics_one(m, "lathe_publisher_datasets_swept_objects_total", LT_METRIC_COUNTER,
                 "Objects of datasets that never came to exist (a crash between an upload's data and its meta) "
                 "deleted by the garbage collector.",
                 (double)st.datasets_swept);
  lt_metrics_one(m, "lathe_publisher_unfolded_resumes_total", LT_METRIC_COUNTER,
                 "Dispatches resuming from a checkpoint commit this publisher never folded (a missed record; "
                 "its checkpoint is kept as committed).",
                 (double)st.unfolded_resumes);
  int64_t lag = lt_bus_consumer_lag(p->consumer);
  lt_metrics_one(m, "lathe_publisher_consumer_lag_records", LT_METRIC_GAUGE,
                 "Records of the control and job topics not folded yet (-1: unknown).", (double)lag);
  int64_t quiet = p->last_record_ms ? lt_time_wall_ms() - p->last_record_ms : 0;
  lt_metrics_one(m, "lathe_publisher_last_record_age_seconds", LT_METRIC_GAUGE,
                 "Seconds since the last record was folded (0 before the first).", (double)quiet / 1000.0);
  return lt_metrics_text(m, NULL);
}

int lt_publisher_health(lt_publisher_t *p, char **json) {
  json_t *o = json_pack("{s:s,s:b,s:I}", "role", "publisher", "ready", p->stats.ready, "waiting", (json_int_t)p->ntodo);
  *json = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return p->stats.ready ? 200 : 503;
}

void lt_publisher_destroy(lt_publisher_t *p) {
  if (!p) return;
  if (p->consumer_ev) event_free(p->consumer_ev);
  if (p->tick_ev) event_free(p->tick_ev);
  lt_bus_consumer_destroy(p->consumer);
  lt_bus_producer_destroy(p->producer, 5000);
  lt_keyring_destroy(p->keyring);
  lt_proj_destroy(p->proj);
  json_decref(p->ckpt_ev);
  json_decref(p->done_ev);
  json_decref(p->ckpt_dirs);
  lt_map_destroy(p->dataset_suspects);
  for (size_t i = 0; i < p->ntodo; i++) free(p->todo[i].payload);
  free(p->todo);
  free(p->parts); /* and the offset arrays carved from it */
  free(p);
}
