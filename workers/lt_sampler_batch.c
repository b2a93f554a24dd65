/* lt_sampler_batch: the sampler's batch thread (lt_sampler.h): admission by fair share, one
 * lt_serve_step at a time over every running request of one base model, then the tokens picked,
 * the text released and the events sent. */
#include "lt_sampler_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "lt_log.h"
#include "lt_time.h"
#include "lt_utf8.h"

/* What one step runs: rows, and for each row that wants logits the request it belongs to. */
typedef struct plan {
  lt_serve_row_t *rows;
  sreq_t **owner; /* [nlogits] */
  int n, nlogits, cap;
  float *logits;  /* (nlogits, V) */
  sbase_t *base;
} plan_t;

/* ---------------------------------------------------------------- events */

static void send_done(lt_sampler_t *s, sreq_t *r, const char *finish, lt_err_t err, const char *msg) {
  int64_t now = lt_time_mono_us();
  lt_sample_event_t ev = {.kind = LT_SAMPLE_DONE, .finish = finish, .err = err, .msg = msg,
                          .prompt_tokens = r->nprompt, .completion_tokens = r->ngen,
                          .ttft_ms = r->first_us ? (r->first_us - r->t0_us) / 1000 : -1,
                          .duration_ms = (now - r->t0_us) / 1000};
  s->st.finished++;
  s->st.prompt_tokens += (uint64_t)r->nprompt;
  s->st.completion_tokens += (uint64_t)r->ngen;
  if (!r->cancelled) r->on_event(r->ctx, &ev);
}

/* Unlinks r from the running list and frees it. Under mu. */
static void leave(lt_sampler_t *s, sreq_t *r) {
  for (sreq_t **p = &s->running; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      s->nrunning--;
      break;
    }
  lt_sampler_req_free(s, r);
}

/* The longest suffix of text[0..len) that is a proper prefix of a stop string: held back, as
 * the next tokens may complete the stop string. */
static size_t stop_tail(const sreq_t *r, const char *text, size_t len) {
  size_t hold = 0;
  for (int i = 0; i < r->nstop; i++) {
    size_t sl = strlen(r->stop[i]);
    for (size_t k = sl - 1; k > hold; k--)
      if (k <= len && memcmp(text + len - k, r->stop[i], k) == 0) {
        hold = k;
        break;
      }
  }
  return hold;
}

/* Appends a token's bytes (raw, len) to what r generated; sets *release to the bytes of text the
 * client may see now and returns true when a stop string ended the text (cut before it). Only the
 * new bytes and the stop strings' reach before them are searched: an earlier match ended r. */
static bool text_update(sreq_t *r, const char *raw, size_t rlen, bool final, size_t *release) {
  size_t old = r->text_len, reach = 0;
  if (rlen && old + rlen + 1 > r->text_cap) { /* doubling; not realloc: the old copy is cleansed */
    size_t cap = r->text_cap ? r->text_cap : 256;
    while (cap < old + rlen + 1) cap *= 2;
    char *t = malloc(cap);
    if (!t) {
      *release = r->sent;
      return false;
    }
    if (r->text) memcpy(t, r->text, old);
    if (r->text) OPENSSL_cleanse(r->text, r->text_cap);
    free(r->text);
    r->text = t;
    r->text_cap = cap;
  }
  if (rlen) {
    memcpy(r->text + old, raw, rlen);
    r->text[old + rlen] = '\0';
    r->text_len = old + rlen;
  }
  size_t len = r->text_len, first = len;
  for (int i = 0; i < r->nstop; i++) reach = strlen(r->stop[i]) > reach ? strlen(r->stop[i]) : reach;
  size_t from = old >= reach ? old - reach + 1 : 0;
  for (int i = 0; i < r->nstop && len > from; i++) {
    char *at = memmem(r->text + from, len - from, r->stop[i], strlen(r->stop[i]));
    if (at && (size_t)(at - r->text) < first) first = (size_t)(at - r->text);
  }
  if (first < len) {
    *release = first > r->sent ? first : r->sent;
    return true;
  }
  if (final) {
    *release = len;
    return false;
  }
  size_t ok = r->text ? lt_utf8_complete(r->text, len) : 0;
  ok -= stop_tail(r, r->text, ok);
  *release = ok > r->sent ? ok : r->sent;
  return false;
}

/* A token's own bytes (raw; *len) and its text for logprobs (invalid UTF-8 replaced), both
 * malloc'd. */
static char *token_bytes(const sbase_t *b, int32_t id, size_t *len) {
  char *raw = NULL;
  *len = 0;
  if (lt_tok_decode(b->tok, &id, 1, 0, &raw, len, NULL, 0)) return strdup("");
  return raw;
}

static char *token_text(const sbase_t *b, int32_t id) {
  size_t len;
  char *raw = token_bytes(b, id, &len), *out = raw ? lt_utf8_sanitize(raw, len, &len) : NULL;
  free(raw);
  return out ? out : strdup("");
}

/* Picks r's next token from its logits row, appends it, sends its event; ends r when it is
 * done. Under mu. */
static void emit(lt_sampler_t *s, sreq_t *r, const float *logits) {
  int32_t top_ids[LT_SAMPLE_MAX_TOP];
  float top_logp[LT_SAMPLE_MAX_TOP], logp;
  int32_t t = lt_picker_pick(&r->pk, logits, &r->sp, &logp, r->top_logprobs, top_ids, top_logp);
  r->ids[r->nprompt + r->ngen++] = t;
  if (!r->first_us) r->first_us = lt_time_mono_us();
  bool eos = t == r->base->eos_id;
  bool length = r->ngen >= r->max_tokens || r->nprompt + r->ngen >= r->base->max_positions;
  size_t release, rlen, len;
  char *raw = token_bytes(r->base, t, &rlen);
  /* The text is the tokens' bytes one after the other, without special tokens (the end token's
   * among them): what decoding the whole sequence with skip_special gives. */
  bool shown = raw && !eos && !lt_tok_is_special(r->base->tok, t);
  bool stopped = text_update(r, raw, shown ? rlen : 0, eos || length, &release);
  char *delta = lt_utf8_sanitize(r->text ? r->text + r->sent : "", release - r->sent, &len);
  char *tt = raw ? lt_utf8_sanitize(raw, rlen, &rlen) : strdup(""), *alts[LT_SAMPLE_MAX_TOP] = {0};
  free(raw);
  for (int i = 0; i < r->top_logprobs; i++) alts[i] = token_text(r->base, top_ids[i]);
  lt_sample_event_t ev = {.kind = LT_SAMPLE_TOKEN, .token = t, .logp = logp, .text = delta ? delta : "",
                          .text_len = delta ? len : 0, .token_text = tt ? tt : "", .ntop = r->top_logprobs,
                          .top_ids = top_ids, .top_logp = top_logp, .top_text = (const char *const *)alts};
  r->sent = release;
  if (!r->cancelled) r->on_event(r->ctx, &ev);
  free(delta);
  free(tt);
  for (int i = 0; i < r->top_logprobs; i++) free(alts[i]);
  if (eos || stopped || length) {
    send_done(s, r, eos || stopped ? "stop" : "length", LT_OK, NULL);
    leave(s, r);
  }
}

/* ---------------------------------------------------------------- admission */

/* Ends cancelled and timed-out requests. Under mu. */
static void reap(lt_sampler_t *s) {
  int64_t now = lt_time_mono_ms();
  for (sreq_t *r = s->running, *next; r; r = next) {
    next = r->next;
    if (r->cancelled) {
      s->st.cancelled++;
      leave(s, r);
    } else if (r->deadline_ms && now >= r->deadline_ms) {
      s->st.timeouts++;
      send_done(s, r, "timeout", LT_ERR_TIMEOUT, "the request's deadline passed");
      leave(s, r);
    }
  }
  for (sreq_t **p = &s->queue; *p;) {
    sreq_t *r = *p;
    if (r->deadline_ms && now >= r->deadline_ms) {
      *p = r->next;
      s->st.timeouts++;
      send_done(s, r, "timeout", LT_ERR_TIMEOUT, "the request's deadline passed while it waited");
      lt_sampler_req_free(s, r);
    } else {
      p = &r->next;
    }
  }
}

/* The queued request to admit next, of a base not in `full`: a preempted one first (it holds
 * decoded work), else the oldest of the tenant with the fewest rows run per unit of weight.
 * NULL when none. Under mu. */
static sreq_t **next_queued(lt_sampler_t *s, const bool *full) {
  sreq_t **best = NULL;
  double best_served = 0;
  for (sreq_t **p = &s->queue; *p; p = &(*p)->next) {
    if (full[(*p)->base - s->bases]) continue;
    if ((*p)->ngen > 0) return p;
    stenant_t *t = lt_sampler_tenant(s, (*p)->tenant);
    double served = t ? t->served : 0;
    if (!best || served < best_served) best = p, best_served = served;
  }
  return best;
}

/* Moves queued requests into the batch while there is room: a running slot, and free cache
 * blocks for all it holds so far plus its next token (a request admitted with less would take
 * blocks from newer ones, which then take them back: with a pool for 2-3 of 8 long requests,
 * admitting on one free block preempted 365 times, this 13: test_sampler). A base whose next
 * request does not fit admits nothing more this call (no smaller request overtakes it there);
 * the other bases, each with a cache of its own, go on. Under mu. */
static void admit(lt_sampler_t *s) {
  int promised[SAMPLER_MAX_BASES] = {0}; /* blocks admitted this call, not yet reserved */
  bool full[SAMPLER_MAX_BASES] = {false};
  sreq_t **p;
  while (s->nrunning < s->conf.max_running && (p = next_queued(s, full))) {
    sreq_t *r = *p;
    int bt = lt_serve_block_tokens(r->base->srv), bi = (int)(r->base - s->bases);
    int need = (r->nprompt + r->ngen + bt) / bt; /* positions [0, nprompt + ngen] */
    char msg[256];
    if (lt_serve_blocks_free(r->base->srv) - promised[bi] < need ||
        lt_serve_seq_open(r->base->srv, r->ad ? r->ad->a : NULL, &r->seq, msg, sizeof msg)) {
      full[bi] = true;
      continue;
    }
    promised[bi] += need;
    *p = r->next;
    r->order = ++s->next_order;
    r->done_pos = 0;
    r->next = s->running;
    s->running = r;
    s->nrunning++;
  }
}

/* Frees the newest running request of base b other than keep (its work is recomputed when it is
 * admitted again: the batch is invariant, so the tokens come out the same). False when there is
 * none. Under mu. */
static bool preempt(lt_sampler_t *s, sbase_t *b, const sreq_t *keep, const plan_t *pl) {
  sreq_t *victim = NULL;
  for (sreq_t *r = s->running; r; r = r->next) {
    if (r == keep || r->base != b) continue;
    bool planned = false;
    for (int i = 0; i < pl->n && !planned; i++) planned = pl->rows[i].seq == r->seq;
    if (!planned && (!victim || r->order > victim->order)) victim = r;
  }
  if (!victim) return false;
  for (sreq_t **p = &s->running; *p; p = &(*p)->next)
    if (*p == victim) {
      *p = victim->next;
      break;
    }
  s->nrunning--;
  lt_serve_seq_close(b->srv, victim->seq);
  victim->seq = -1;
  victim->done_pos = 0;
  victim->next = s->queue;
  s->queue = victim;
  s->st.preempted++;
  return true;
}

/* ---------------------------------------------------------------- the step */

/* Adds rows of r (positions done_pos .. done_pos + take - 1) to the plan, reserving their cache
 * blocks; preempts newer requests when the pool is out. False when r itself had to wait. */
static bool plan_rows(lt_sampler_t *s, plan_t *pl, sreq_t *r, int take) {
  char msg[256];
  while (lt_serve_seq_reserve(r->base->srv, r->seq, r->done_pos + take, msg, sizeof msg) == LT_SERVE_BUSY)
    if (!preempt(s, r->base, r, pl)) return false;
  int total = r->nprompt + r->ngen;
  for (int i = 0; i < take; i++) {
    int pos = r->done_pos + i;
    bool last = pos == total - 1;
    pl->rows[pl->n++] = (lt_serve_row_t){.seq = r->seq, .token = r->ids[pos], .pos = pos, .logits = last};
    if (last) pl->owner[pl->nlogits++] = r;
  }
  return true;
}

/* The base model whose requests run next (round robin among those with running requests). */
static sbase_t *pick_base(lt_sampler_t *s) {
  for (int k = 0; k < s->nbases; k++) {
    sbase_t *b = &s->bases[(s->next_base + k) % s->nbases];
    for (sreq_t *r = s->running; r; r = r->next)
      if (r->base == b) {
        s->next_base = (int)(b - s->bases + 1) % s->nbases;
        return b;
      }
  }
  return NULL;
}

/* Plans one step of base b: every decoding request's next row, then prompt rows up to
 * prefill_chunk, oldest admission first. Under mu. */
static void plan_step(lt_sampler_t *s, plan_t *pl, sbase_t *b) {
  pl->n = pl->nlogits = 0;
  pl->base = b;
  sreq_t *order[SAMPLER_MAX_RUNNING];
  int m = 0;
  for (sreq_t *r = s->running; r && m < SAMPLER_MAX_RUNNING; r = r->next)
    if (r->base == b) order[m++] = r;
  for (int i = 1; i < m; i++) /* admission order, oldest first */
    for (int j = i; j > 0 && order[j]->order < order[j - 1]->order; j--) {
      sreq_t *t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (int i = 0; i < m; i++)
    if (order[i]->seq >= 0 && order[i]->nprompt + order[i]->ngen - order[i]->done_pos == 1) plan_rows(s, pl, order[i], 1);
  int budget = s->conf.prefill_chunk;
  for (int i = 0; i < m && budget > 0; i++) {
    sreq_t *r = order[i];
    int left = r->nprompt + r->ngen - r->done_pos;
    if (r->seq < 0 || left <= 1 || pl->n >= pl->cap) continue;
    int take = left < budget ? left : budget;
    if (take > pl->cap - pl->n) take = pl->cap - pl->n;
    if (plan_rows(s, pl, r, take)) budget -= take;
  }
}

/* Runs the plan without the lock, then hands each row's logits to its request. */
static void run_step(lt_sampler_t *s, plan_t *pl) {
  if (pl->n == 0) return;
  sbase_t *b = pl->base;
  char msg[256];
  pthread_mutex_unlock(&s->mu);
  lt_err_t err = lt_serve_step(b->srv, pl->rows, pl->n, pl->logits, msg, sizeof msg);
  pthread_mutex_lock(&s->mu);
  s->st.steps++;
  s->st.rows += (uint64_t)pl->n;
  if (err) {
    /* A failed step left nothing dependable in the cache: every request with rows in it ends,
     * prefilling ones too (advancing them would decode from keys and values never written). */
    for (sreq_t *r = s->running, *next; r; r = next) {
      next = r->next;
      bool in = false;
      for (int i = 0; i < pl->n && !in; i++) in = r->base == b && r->seq == pl->rows[i].seq;
      if (in && !r->cancelled) {
        send_done(s, r, "error", err, msg);
        leave(s, r);
      }
    }
    return;
  }
  /* The rows are in the cache now: advance every request that had rows in the step. */
  for (int i = 0; i < pl->n; i++)
    for (sreq_t *r = s->running; r; r = r->next)
      if (r->seq == pl->rows[i].seq && r->base == b && r->done_pos == pl->rows[i].pos) r->done_pos++;
  /* Each row is charged to its tenant's clock, a prompt's as a decoded token's: they cost the step
   * the same, and a clock of decode alone let long prompts with a token or two of output take
   * the batch (test_sampler). A recompute after preemption is the sampler's doing: not charged. */
  for (sreq_t *r = s->running; r; r = r->next)
    if (r->base == b && r->done_pos > r->charged) {
      stenant_t *tn = lt_sampler_tenant(s, r->tenant);
      if (tn) tn->served += (r->done_pos - r->charged) / r->weight;
      r->charged = r->done_pos;
    }
  for (int i = 0; i < pl->nlogits; i++) {
    sreq_t *r = pl->owner[i];
    if (!r->cancelled) emit(s, r, pl->logits + (size_t)i * b->V); /* else reap frees it */
  }
}

static lt_err_t plan_alloc(lt_sampler_t *s, plan_t *pl) {
  int V = 0;
  for (int i = 0; i < s->nbases; i++)
    if (s->bases[i].V > V) V = s->bases[i].V;
  pl->cap = s->conf.max_running + s->conf.prefill_chunk;
  pl->rows = malloc((size_t)pl->cap * sizeof *pl->rows);
  pl->owner = malloc((size_t)pl->cap * sizeof *pl->owner);
  pl->logits = malloc((size_t)pl->cap * (size_t)V * sizeof *pl->logits);
  return pl->rows && pl->owner && pl->logits ? LT_OK : LT_ERR_NOMEM;
}

void *lt_sampler_batch_main(void *arg) {
  lt_sampler_t *s = arg;
  plan_t pl = {0};
  if (plan_alloc(s, &pl)) {
    lt_log_error("sampler", "out of memory for the batch");
    return NULL;
  }
  pthread_mutex_lock(&s->mu);
  while (!s->stopping) {
    reap(s);
    admit(s);
    sbase_t *b = pick_base(s);
    if (b) plan_step(s, &pl, b);
    if (!b || pl.n == 0) {
      /* Idle (or every request waits for cache blocks): wake for a submit or cancel, or a
       * deadline. */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += (b ? 1 : 100) * 1000 * 1000;
      if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
      pthread_cond_timedwait(&s->cv, &s->mu, &ts);
      continue;
    }
    run_step(s, &pl);
  }
  pthread_mutex_unlock(&s->mu);
  free(pl.rows);
  free(pl.owner);
  free(pl.logits);
  return NULL;
}
