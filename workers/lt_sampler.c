/* lt_sampler: base models, the adapter cache, submit and cancel (lt_sampler.h; the batch thread
 * is lt_sampler_batch.c). */
#include "lt_sampler_int.h"
#include "lt_models.h"

#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "lt_backend.h"
#include "lt_chat.h"
#include "lt_log.h"
#include "lt_metrics.h"
#include "lt_time.h"
#include "lt_train.h"

/* ---------------------------------------------------------------- base models */

/* The chat template and special tokens of a base model, from its tokenizer_config.json (none
 * when the file is absent: chat completions then answer that the model has no template). */
static void base_chat_config(sbase_t *b, const char *dir) {
  char path[2500];
  size_t len = 0;
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  char *text = NULL, msg[256];
  if (lt_train_read_file(path, &text, &len, msg, sizeof msg) == LT_OK &&
      lt_chat_config_parse(text, len, &b->tmpl, &b->bos, &b->eos, msg, sizeof msg))
    lt_log_warn("sampler", "%s: no chat template: %s", b->name, msg);
  free(text);
  b->eos_id = b->eos ? lt_tok_token_id(b->tok, b->eos) : -1;
  if (b->eos_id < 0) b->eos_id = lt_tok_eos_id(b->tok);
}

/* Opens the base model in dir (config.json, model.safetensors, tokenizer.json) with its cache. */
static lt_err_t base_open(lt_sampler_t *s, sbase_t *b, const char *name, const char *dir, char *msg, size_t n) {
  snprintf(b->name, sizeof b->name, "%s", name);
  char path[2500];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  lt_err_t err = lt_tok_load_file(path, &b->tok, msg, n);
  if (!err) err = lt_engine_open(dir, s->be, &b->eng, msg, n);
  if (err) return err;
  const lt_model_config_t *c = lt_engine_config(b->eng);
  b->V = c->vocab_size;
  b->max_positions = c->max_position;
  lt_serve_conf_t sc = {.block_tokens = s->conf.block_tokens, .kv_bytes = s->conf.kv_bytes,
                        .max_rows = s->conf.max_running + s->conf.prefill_chunk};
  if ((err = lt_serve_new(b->eng, &sc, &b->srv, msg, n))) return err;
  base_chat_config(b, dir);
  return LT_OK;
}

static void base_close(sbase_t *b) {
  lt_serve_free(b->srv);
  lt_engine_close(b->eng);
  lt_tok_destroy(b->tok);
  free(b->tmpl);
  free(b->bos);
  free(b->eos);
  memset(b, 0, sizeof *b);
}

/* Every model directory under models_dir (sorted by name: the order /v1/models lists). */
static lt_err_t open_bases(lt_sampler_t *s, char *msg, size_t n) {
  static const char *const need[] = {"tokenizer.json", "config.json", NULL};
  char (*names)[LT_JOB_NAME_MAX] = calloc(SAMPLER_MAX_BASES, sizeof *names);
  if (!names) return lt_errf(msg, n, LT_ERR_NOMEM, "out of memory");
  size_t count = lt_models_list(s->models_dir, need, names, SAMPLER_MAX_BASES);
  for (size_t i = 0; i < count && i < SAMPLER_MAX_BASES; i++) {
    char dir[2400], why[256];
    snprintf(dir, sizeof dir, "%s/%s", s->models_dir, names[i]);
    sbase_t *b = &s->bases[s->nbases];
    if (base_open(s, b, names[i], dir, why, sizeof why)) {
      lt_log_warn("sampler", "base model %s not served: %s", names[i], why);
      base_close(b);
    } else {
      s->names[s->nbases++] = b->name;
    }
  }
  free(names);
  if (s->nbases == 0) return lt_errf(msg, n, LT_ERR_NOT_FOUND, "no base model to serve in %s", s->models_dir);
  return LT_OK;
}

/* Every model directory under models_dir (sorted by name: the order /v1/models lists). */
static sbase_t *find_base(lt_sampler_t *s, const char *name) {
  for (int i = 0; i < s->nbases; i++)
    if (strcmp(s->bases[i].name, name) == 0) return &s->bases[i];
  return NULL;
}

/* ---------------------------------------------------------------- tenants */

stenant_t *lt_sampler_tenant(lt_sampler_t *s, const char *tenant) {
  for (int i = 0; i < s->ntenants; i++)
    if (strcmp(s->tenants[i].id, tenant) == 0) return &s->tenants[i];
  if (s->ntenants == s->tenants_cap) {
    int cap = s->tenants_cap ? 2 * s->tenants_cap : 16;
    stenant_t *nt = realloc(s->tenants, (size_t)cap * sizeof *nt);
    if (!nt) return NULL;
    s->tenants = nt;
    s->tenants_cap = cap;
  }
  /* A newcomer starts at the least served tenant's clock: no credit saved up while away. The table
   * holds only tenants with requests in the sampler (tenant_drop_idle), so a tenant that comes back
   * is a newcomer too, and an idle tenant's old clock never lowers the floor. */
  double floor = 0;
  for (int i = 0; i < s->ntenants; i++)
    if (i == 0 || s->tenants[i].served < floor) floor = s->tenants[i].served;
  stenant_t *t = &s->tenants[s->ntenants++];
  memset(t, 0, sizeof *t);
  snprintf(t->id, sizeof t->id, "%s", tenant);
  t->served = floor;
  return t;
}

/* Drops t's row once nothing of it is in the sampler (see lt_sampler_tenant). Under mu. */
static void tenant_drop_idle(lt_sampler_t *s, stenant_t *t) {
  if (t && t->inflight <= 0) *t = s->tenants[--s->ntenants];
}

/* ---------------------------------------------------------------- adapters */

static sadapter_t *find_adapter(lt_sampler_t *s, const char *id) {
  for (sadapter_t *a = s->adapters; a; a = a->next)
    if (!a->forgotten && strcmp(a->id, id) == 0) return a;
  return NULL;
}

/* Unlinks *p from the cache and frees it, its weights zeroed first. Under mu. */
static void drop_adapter(lt_sampler_t *s, sadapter_t **p) {
  sadapter_t *a = *p;
  *p = a->next;
  s->adapter_total -= a->bytes;
  lt_adapter_free(a->a); /* zeroes the tenant's weights before the memory is reused */
  free(a);
}

/* A request let go of a: a forgotten adapter goes with its last. Under mu. */
static void release_adapter(lt_sampler_t *s, sadapter_t *a) {
  if (--a->refs > 0 || !a->forgotten) return;
  for (sadapter_t **p = &s->adapters; *p; p = &(*p)->next)
    if (*p == a) {
      drop_adapter(s, p);
      s->st.adapter_forgotten++;
      return;
    }
}

/* A job was deleted: its adapters ("tenant/job", and its checkpoints' "tenant/job/...") leave the
 * cache, zeroed — now, or when the last request that holds one ends; none is found again. */
static void op_forget(void *ctx, const char *prefix) {
  lt_sampler_t *s = ctx;
  size_t pl = strlen(prefix);
  pthread_mutex_lock(&s->mu);
  for (sadapter_t **p = &s->adapters; *p;) {
    sadapter_t *a = *p;
    if (strncmp(a->id, prefix, pl) != 0 || (a->id[pl] != '\0' && a->id[pl] != '/')) {
      p = &a->next;
    } else if (a->refs > 0) {
      a->forgotten = true;
      p = &a->next;
    } else {
      drop_adapter(s, p);
      s->st.adapter_forgotten++;
    }
  }
  pthread_mutex_unlock(&s->mu);
}

/* Keeps a for a request about to submit (conf.adapter_hold_ms). Under mu. */
static void hold_adapter(lt_sampler_t *s, sadapter_t *a) {
  if (s->conf.adapter_hold_ms > 0) a->held_until_us = lt_time_mono_us() + (int64_t)s->conf.adapter_hold_ms * 1000;
}

/* Evicts least recently used adapters no request holds, nor is about to (hold_adapter), until
 * `need` more bytes fit. Under mu. False when they cannot: every adapter in the way is in use. */
static bool make_room(lt_sampler_t *s, size_t need) {
  int64_t now = lt_time_mono_us();
  while (s->adapter_total + need > s->conf.adapter_bytes) {
    sadapter_t **victim = NULL;
    for (sadapter_t **p = &s->adapters; *p; p = &(*p)->next)
      if ((*p)->refs == 0 && (*p)->held_until_us <= now && (!victim || (*p)->used < (*victim)->used)) victim = p;
    if (!victim) return false;
    drop_adapter(s, victim);
    s->st.adapter_evictions++;
  }
  return true;
}

/* Bytes of the adapters of the owner of id (the tenant: ids are "tenant/job[/checkpoint]") that
 * requests use now, and how many. Under mu. */
static size_t owner_in_use(lt_sampler_t *s, const char *id, int *count) {
  size_t own = strcspn(id, "/"), bytes = 0;
  *count = 0;
  for (sadapter_t *a = s->adapters; a; a = a->next)
    if (a->refs > 0 && strncmp(a->id, id, own) == 0 && a->id[own] == '/') bytes += a->bytes, (*count)++;
  return bytes;
}

static bool op_has_adapter(void *ctx, const char *id) {
  lt_sampler_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  sadapter_t *a = find_adapter(s, id);
  if (a) a->used = ++s->clock, hold_adapter(s, a); /* the caller submits to it next */
  if (a) s->st.adapter_hits++;
  else s->st.adapter_misses++;
  pthread_mutex_unlock(&s->mu);
  return a != NULL;
}

static lt_err_t op_load_adapter(void *ctx, const char *id, const char *base, const void *st, size_t st_len,
                                const char *config, size_t config_len, char *msg, size_t n) {
  lt_sampler_t *s = ctx;
  sbase_t *b = find_base(s, base);
  if (!b) return lt_errf(msg, n, LT_ERR_NOT_FOUND, "base model %s is not served here", base);
  if (strlen(id) > LT_SAMPLE_ADAPTER_MAX) return lt_errf(msg, n, LT_ERR_INVALID, "adapter id too long");
  pthread_mutex_lock(&s->load_mu);
  pthread_mutex_lock(&s->mu);
  sadapter_t *found = find_adapter(s, id);
  if (found) hold_adapter(s, found); /* another request loaded it: this one submits to it next */
  bool have = found != NULL;
  pthread_mutex_unlock(&s->mu);
  lt_err_t err = LT_OK;
  lt_adapter_t *ad = NULL;
  if (!have) err = lt_adapter_load(b->eng, st, st_len, config, config_len, &ad, msg, n);
  if (!have && !err) {
    size_t bytes = lt_adapter_bytes(ad);
    sadapter_t *e = calloc(1, sizeof *e);
    pthread_mutex_lock(&s->mu);
    if (!e) err = lt_errf(msg, n, LT_ERR_NOMEM, "out of memory");
    else if (bytes > s->conf.adapter_bytes)
      err = lt_errf(msg, n, LT_ERR_UNSUPPORTED, "the adapter is %zu bytes, more than this sampler's whole adapter cache "
                    "(%zu bytes, LATHE_SAMPLER_ADAPTER_MB): it cannot be served here", bytes, s->conf.adapter_bytes);
    else if (!make_room(s, bytes))
      err = lt_errf(msg, n, LT_ERR_QUOTA, "the adapter cache (%zu bytes) is full of adapters in use or just loaded for "
                    "a request", s->conf.adapter_bytes);
    if (!err) {
      snprintf(e->id, sizeof e->id, "%s", id);
      e->base = b;
      e->a = ad;
      e->bytes = bytes;
      e->used = ++s->clock;
      hold_adapter(s, e); /* its request submits to it next: no other load may evict it first */
      e->next = s->adapters;
      s->adapters = e;
      s->adapter_total += bytes;
      s->st.adapter_loads++;
      ad = NULL;
      e = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    free(e);
    lt_adapter_free(ad);
  }
  pthread_mutex_unlock(&s->load_mu);
  return err;
}

/* ---------------------------------------------------------------- requests */

/* Frees a request's own memory, what holds the tenant's text cleansed first: its stop strings,
 * the prompt's and output's token ids, the decoded text. */
static void req_scrub_free(sreq_t *r) {
  for (int i = 0; i < r->nstop; i++) {
    OPENSSL_cleanse(r->stop[i], strlen(r->stop[i]));
    free(r->stop[i]);
  }
  lt_picker_free(&r->pk);
  if (r->ids) OPENSSL_cleanse(r->ids, (size_t)r->cap * sizeof *r->ids);
  if (r->text) OPENSSL_cleanse(r->text, r->text_cap);
  free(r->ids);
  free(r->text);
  free(r);
}

void lt_sampler_req_free(lt_sampler_t *s, sreq_t *r) {
  if (r->seq >= 0) lt_serve_seq_close(r->base->srv, r->seq);
  if (r->ad) release_adapter(s, r->ad);
  stenant_t *t = lt_sampler_tenant(s, r->tenant);
  if (t) t->inflight--;
  tenant_drop_idle(s, t);
  s->inflight--;
  req_scrub_free(r);
}

/* The prompt's tokens into a new request (not yet queued). */
static lt_err_t req_tokens(sreq_t *r, const lt_sample_req_t *in, char *msg, size_t n) {
  lt_tok_seq_t seq;
  lt_tok_seq_init(&seq);
  const lt_tok_t *tok = r->base->tok;
  lt_err_t err = lt_tok_encode(tok, in->prompt, strlen(in->prompt), in->special ? LT_TOK_SPECIAL : 0, 1, &seq, msg, n);
  int limit = r->base->max_positions;
  int pool = lt_serve_blocks_total(r->base->srv) * lt_serve_block_tokens(r->base->srv);
  if (pool < limit) limit = pool;
  if (!err && seq.len == 0) err = lt_errf(msg, n, LT_ERR_INVALID, "prompt: empty (it has no tokens)");
  if (!err && (long)seq.len + in->max_tokens > limit)
    err = lt_errf(msg, n, LT_ERR_INVALID, "prompt (%zu tokens) + max_tokens (%d) exceeds %d, the most this sampler holds "
                  "for %s", seq.len, in->max_tokens, limit, r->base->name);
  if (!err) {
    r->cap = (int)seq.len + in->max_tokens;
    if (!(r->ids = malloc((size_t)r->cap * sizeof *r->ids))) err = LT_ERR_NOMEM;
  }
  if (!err) {
    memcpy(r->ids, seq.ids, seq.len * sizeof *r->ids);
    r->nprompt = (int)seq.len;
  }
  lt_tok_seq_free(&seq);
  return err;
}

/* A new request from in: checked, tokenized, its picker seeded. */
static lt_err_t req_new(lt_sampler_t *s, const lt_sample_req_t *in, sreq_t **out, char *msg, size_t n) {
  sbase_t *b = find_base(s, in->base);
  if (!b) return lt_errf(msg, n, LT_ERR_NOT_FOUND, "model: base model %s is not served here", in->base);
  if (in->max_tokens < 1) return lt_errf(msg, n, LT_ERR_INVALID, "max_tokens: %d, expected >= 1", in->max_tokens);
  if (in->nstop < 0 || in->nstop > LT_SAMPLE_MAX_STOP || in->top_logprobs < 0 || in->top_logprobs > LT_SAMPLE_MAX_TOP)
    return lt_errf(msg, n, LT_ERR_INVALID, "stop or logprobs out of range");
  sreq_t *r = calloc(1, sizeof *r);
  if (!r) return LT_ERR_NOMEM;
  r->base = b;
  r->seq = -1;
  r->weight = in->weight > 0 ? in->weight : 1;
  snprintf(r->tenant, sizeof r->tenant, "%s", in->tenant);
  r->max_tokens = in->max_tokens;
  r->top_logprobs = in->top_logprobs;
  r->sp = (lt_sample_params_t){.max_tokens = in->max_tokens, .temperature = in->temperature,
                               .top_p = in->top_p > 0 ? in->top_p : 1, .top_k = in->top_k, .seed = in->seed};
  r->deadline_ms = in->deadline_ms;
  r->on_event = in->on_event;
  r->ctx = in->ctx;
  r->t0_us = lt_time_mono_us();
  lt_err_t err = lt_picker_init(&r->pk, b->V, in->seed, msg, n);
  for (int i = 0; !err && i < in->nstop; i++)
    if (in->stop[i][0] && !(r->stop[r->nstop++] = strdup(in->stop[i]))) err = LT_ERR_NOMEM;
  if (!err) err = req_tokens(r, in, msg, n);
  if (err) {
    req_scrub_free(r);
    return err;
  }
  *out = r;
  return LT_OK;
}

/* A request would put a to use, which no request uses yet: refused when its tenant's requests
 * use other adapters already and a would take them past half the cache. Requests hold their
 * adapters (no eviction) until they end, so one tenant's long requests on many checkpoints would
 * otherwise keep every other tenant's adapter out (429 "cache full" for as long as they run).
 * A tenant using none may always use one, however large. Under mu. */
static bool adapter_over_share(lt_sampler_t *s, const sadapter_t *a, char *msg, size_t n) {
  int count = 0;
  size_t used = owner_in_use(s, a->id, &count), share = s->conf.adapter_bytes / 2;
  if (!count || used + a->bytes <= share) return false;
  lt_errf(msg, n, LT_ERR_QUOTA, "this tenant's requests use %d other adapter(s) (%zu bytes) of the sampler's adapter "
          "cache; one tenant may use at most half of it (%zu bytes) at once, so that others' fit: retry when one ends",
          count, used, share);
  return true;
}

static lt_err_t op_submit(void *ctx, const lt_sample_req_t *in, uint64_t *handle, char *msg, size_t n) {
  lt_sampler_t *s = ctx;
  sreq_t *r = NULL;
  lt_err_t err = req_new(s, in, &r, msg, n);
  if (err) { /* refused before it was queued: it ends its adapter's hold as any refusal does */
    pthread_mutex_lock(&s->mu);
    sadapter_t *a = in->adapter && in->adapter[0] ? find_adapter(s, in->adapter) : NULL;
    if (a) a->held_until_us = 0;
    pthread_mutex_unlock(&s->mu);
    return err;
  }
  pthread_mutex_lock(&s->mu);
  stenant_t *t = lt_sampler_tenant(s, in->tenant);
  sadapter_t *a = in->adapter && in->adapter[0] ? find_adapter(s, in->adapter) : NULL;
  if (!t) err = LT_ERR_NOMEM;
  else if (in->adapter && in->adapter[0] && (!a || a->base != r->base))
    err = lt_errf(msg, n, LT_ERR_NOT_FOUND, "adapter %s is not loaded", in->adapter);
  else if (a && a->refs == 0 && adapter_over_share(s, a, msg, n))
    err = LT_ERR_QUOTA;
  else if (t->inflight >= s->conf.queue_per_tenant)
    err = lt_errf(msg, n, LT_ERR_QUOTA, "too many requests of this tenant in the sampler (limit %d)", s->conf.queue_per_tenant);
  else if (s->inflight >= s->conf.queue_total)
    err = lt_errf(msg, n, LT_ERR_QUOTA, "the sampler is full (%d requests)", s->conf.queue_total);
  if (err) {
    if (err == LT_ERR_QUOTA) s->st.rejected++;
    if (a) a->held_until_us = 0; /* the request it was held for ends here: no pinning by refused requests */
    tenant_drop_idle(s, t);
    pthread_mutex_unlock(&s->mu);
    req_scrub_free(r);
    return err;
  }
  r->ad = a;
  if (a) a->refs++, a->used = ++s->clock, a->held_until_us = 0; /* held by the request now, not the hold */
  t->inflight++;
  s->inflight++;
  s->st.requests++;
  *handle = r->handle = ++s->next_handle;
  sreq_t **p = &s->queue;
  while (*p) p = &(*p)->next;
  *p = r;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return LT_OK;
}

static void op_cancel(void *ctx, uint64_t handle, int *prompt_tokens, int *completion_tokens) {
  lt_sampler_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  for (sreq_t **p = &s->queue; *p; p = &(*p)->next)
    if ((*p)->handle == handle) { /* queued: never admitted, or preempted (its tokens so far kept) */
      sreq_t *r = *p;
      *p = r->next;
      s->st.cancelled++;
      if (prompt_tokens) *prompt_tokens = r->nprompt;
      if (completion_tokens) *completion_tokens = r->ngen;
      lt_sampler_req_free(s, r);
      pthread_mutex_unlock(&s->mu);
      return;
    }
  /* A running one: no event from now on; the batch thread frees it after the step under way. A
   * handle found nowhere (it ended: its DONE is on its way) leaves the counts as they are. */
  for (sreq_t *r = s->running; r; r = r->next)
    if (r->handle == handle) {
      r->cancelled = true;
      if (prompt_tokens) *prompt_tokens = r->nprompt;
      if (completion_tokens) *completion_tokens = r->ngen;
    }
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static lt_err_t op_model_info(void *ctx, const char *base, char **tmpl, char **bos, char **eos, char *msg, size_t n) {
  lt_sampler_t *s = ctx;
  sbase_t *b = find_base(s, base);
  if (!b) return lt_errf(msg, n, LT_ERR_NOT_FOUND, "base model %s is not served here", base);
  *tmpl = b->tmpl ? strdup(b->tmpl) : NULL;
  *bos = b->bos ? strdup(b->bos) : NULL;
  *eos = b->eos ? strdup(b->eos) : NULL;
  return LT_OK;
}

static const char *const *op_models(void *ctx) { return ((lt_sampler_t *)ctx)->names; }

static char *op_metrics(void *ctx) {
  lt_sampler_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  sstats_t st = s->st;
  int queued = 0, blocks_free = 0, blocks_total = 0, running = s->nrunning;
  size_t adapter_bytes = s->adapter_total;
  for (sreq_t *r = s->queue; r; r = r->next) queued++;
  for (int i = 0; i < s->nbases; i++) {
    blocks_free += lt_serve_blocks_free(s->bases[i].srv);
    blocks_total += lt_serve_blocks_total(s->bases[i].srv);
  }
  pthread_mutex_unlock(&s->mu);
  lt_metrics_t *m = lt_metrics_new();
  lt_metrics_one(m, "lathe_sampler_running", LT_METRIC_GAUGE, "Requests decoding now.", running);
  lt_metrics_one(m, "lathe_sampler_queued", LT_METRIC_GAUGE, "Requests admitted and waiting to start.", queued);
  lt_metrics_one(m, "lathe_sampler_kv_blocks_free", LT_METRIC_GAUGE, "Free KV cache blocks of all base models.",
                 blocks_free);
  lt_metrics_one(m, "lathe_sampler_kv_blocks_capacity", LT_METRIC_GAUGE, "KV cache blocks of all base models.",
                 blocks_total);
  lt_metrics_one(m, "lathe_sampler_adapter_cache_bytes", LT_METRIC_GAUGE, "Bytes of adapters held in the cache.",
                 (double)adapter_bytes);
  static const struct {
    const char *name, *help;
    size_t off;
  } counters[] = {
#define C(field, help) {"lathe_sampler_" #field "_total", help, offsetof(sstats_t, field)}
      C(requests, "Sampling requests received."), C(rejected, "Requests refused for a full queue (429)."),
      C(finished, "Requests that ran to their end."), C(prompt_tokens, "Prompt tokens prefilled."),
      C(completion_tokens, "Tokens generated."), C(steps, "Batch steps run."), C(rows, "Rows of all batch steps."),
      C(preempted, "Requests preempted for KV blocks and recomputed later."),
      C(timeouts, "Requests ended by their timeout."), C(cancelled, "Requests whose client went away."),
      C(adapter_loads, "Adapters read from the store."), C(adapter_hits, "Requests whose adapter was cached."),
      C(adapter_misses, "Requests whose adapter had to be loaded."),
      C(adapter_evictions, "Adapters evicted from the cache."),
      C(adapter_forgotten, "Adapters dropped from the cache because their job was deleted."),
#undef C
  };
  for (size_t i = 0; i < sizeof counters / sizeof *counters; i++) {
    uint64_t v;
    memcpy(&v, (const char *)&st + counters[i].off, sizeof v);
    lt_metrics_one(m, counters[i].name, LT_METRIC_COUNTER, counters[i].help, (double)v);
  }
  return lt_metrics_text(m, NULL);
}

/* ---------------------------------------------------------------- life cycle */

lt_err_t lt_sampler_new(const lt_sampler_conf_t *conf, lt_sampler_t **out, char *msg, size_t n) {
  lt_sampler_t *s = calloc(1, sizeof *s);
  if (!s) return LT_ERR_NOMEM;
  s->conf = *conf;
  snprintf(s->models_dir, sizeof s->models_dir, "%s", conf->models_dir ? conf->models_dir : ".");
  s->conf.models_dir = s->models_dir;
  if (s->conf.threads <= 0) s->conf.threads = 1;
  if (!s->conf.kv_bytes) s->conf.kv_bytes = 64u << 20;
  if (!s->conf.adapter_bytes) s->conf.adapter_bytes = 256u << 20;
  if (!s->conf.adapter_hold_ms) s->conf.adapter_hold_ms = 1000;
  if (s->conf.max_running <= 0) s->conf.max_running = 64;
  if (s->conf.max_running > SAMPLER_MAX_RUNNING) s->conf.max_running = SAMPLER_MAX_RUNNING;
  if (s->conf.prefill_chunk <= 0) s->conf.prefill_chunk = 64;
  if (s->conf.queue_per_tenant <= 0) s->conf.queue_per_tenant = 16;
  if (s->conf.queue_total <= 0) s->conf.queue_total = 128;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->load_mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  lt_cpu_opts_t cpu = {.threads = s->conf.threads, .bf16_weights = s->conf.bf16_weights};
  lt_err_t err = s->conf.cuda ? lt_backend_cuda_new(0, &s->be, msg, n) : lt_backend_cpu_new_opts(&cpu, &s->be, msg, n);
  if (!err) err = open_bases(s, msg, n);
  if (!err && pthread_create(&s->thread, NULL, lt_sampler_batch_main, s) != 0)
    err = lt_errf(msg, n, LT_ERR_INTERNAL, "cannot start the batch thread");
  if (err) {
    lt_sampler_destroy(s);
    return err;
  }
  s->thread_started = true;
  *out = s;
  return LT_OK;
}

void lt_sampler_destroy(lt_sampler_t *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (s->thread_started) pthread_join(s->thread, NULL);
  while (s->queue) {
    sreq_t *r = s->queue;
    s->queue = r->next;
    lt_sampler_req_free(s, r);
  }
  while (s->running) {
    sreq_t *r = s->running;
    s->running = r->next;
    lt_sampler_req_free(s, r);
  }
  while (s->adapters) {
    sadapter_t *a = s->adapters;
    s->adapters = a->next;
    lt_adapter_free(a->a);
    free(a);
  }
  for (int i = 0; i < s->nbases; i++) base_close(&s->bases[i]);
  lt_backend_destroy(s->be);
  free(s->tenants);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->load_mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

void lt_sampler_ops(lt_sampler_t *s, lt_sample_ops_t *out) {
  *out = (lt_sample_ops_t){.ctx = s, .submit = op_submit, .cancel = op_cancel, .has_adapter = op_has_adapter,
                           .load_adapter = op_load_adapter, .model_info = op_model_info, .models = op_models,
                           .metrics = op_metrics, .forget = op_forget};
}
