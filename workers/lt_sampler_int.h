/* lt_sampler_int: what the sampler's two files share. Not public.
 *
 *   lt_sampler.c        base models, the adapter cache, submit and cancel (any thread)
 *   lt_sampler_batch.c  the batch thread: admission, fair share, steps, text, events
 *
 * Everything below `mu` in lt_sampler is read and written under it; the batch thread drops it
 * only around lt_serve_step, during which it alone touches the running requests' sequences. */
#ifndef LT_SAMPLER_INT_H
#define LT_SAMPLER_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "lt_engine.h"
#include "lt_job.h"
#include "lt_sampler.h"
#include "lt_serve.h"
#include "lt_tok.h"

#define SAMPLER_MAX_BASES 16
#define SAMPLER_MAX_RUNNING 256 /* requests decoding at once, at most (a step plans them on the stack) */

/* A base model served: one copy of its weights, its tokenizer and its cache. */
typedef struct sbase {
  char name[LT_JOB_NAME_MAX]; /* an id or ORG/NAME */
  lt_engine_t *eng;
  lt_serve_t *srv;
  lt_tok_t *tok;
  char *tmpl, *bos, *eos; /* from tokenizer_config.json, or NULL */
  int32_t eos_id;         /* -1: none */
  int V, max_positions;
} sbase_t;

/* An adapter in the cache. */
typedef struct sadapter {
  char id[LT_SAMPLE_ADAPTER_MAX + 1];
  sbase_t *base;
  lt_adapter_t *a;
  size_t bytes;
  uint64_t used; /* the LRU clock when last asked for */
  int refs;      /* requests that hold it: not evicted while > 0 */
  bool forgotten; /* its job was deleted (op_forget): found by no request, freed when refs is 0 */
  int64_t held_until_us; /* nor before this (monotonic): a request loaded or found it to submit;
                          * 0 once a submit to it came (held by refs then) or was refused */
  struct sadapter *next;
} sadapter_t;

/* One request (one choice). ids holds the prompt then the tokens generated. */
typedef struct sreq {
  uint64_t handle;
  char tenant[LT_ID_MAX + 1];
  double weight;
  sbase_t *base;
  sadapter_t *ad;   /* NULL: the base model */
  int32_t *ids;
  int nprompt, ngen, cap;
  int done_pos;     /* positions whose keys and values are in the cache */
  int charged;      /* positions charged to its tenant's clock (a recompute after preemption is not) */
  int seq;          /* the lt_serve sequence, or -1 (queued) */
  uint64_t order;   /* admission order: the newest is preempted first */
  lt_sample_params_t sp;
  int max_tokens, top_logprobs;
  char *stop[LT_SAMPLE_MAX_STOP];
  int nstop;
  lt_picker_t pk;
  char *text;       /* the generated text as decoded so far */
  size_t text_len, sent; /* bytes of text, and bytes released to the client */
  size_t text_cap;       /* bytes allocated for text */
  int64_t t0_us, first_us, deadline_ms;
  lt_sample_event_fn *on_event;
  void *ctx;
  bool cancelled;
  struct sreq *next;
} sreq_t;

/* A tenant with requests in the sampler: its share of the batch's rows, by weight. */
typedef struct stenant {
  char id[LT_ID_MAX + 1];
  double served; /* rows run (prompt and decode) / weight: the fair-share clock */
  int inflight;  /* queued + running */
} stenant_t;

typedef struct sstats {
  uint64_t requests, rejected, finished, prompt_tokens, completion_tokens;
  uint64_t steps, rows, preempted, timeouts, cancelled;
  uint64_t adapter_loads, adapter_hits, adapter_misses, adapter_evictions, adapter_forgotten;
} sstats_t;

struct lt_sampler {
  lt_sampler_conf_t conf;
  char models_dir[2048];
  lt_backend_t *be;
  sbase_t bases[SAMPLER_MAX_BASES];
  int nbases;
  const char *names[SAMPLER_MAX_BASES + 1];
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t load_mu; /* one adapter load at a time (memory budget, backend uploads) */
  /* Under mu: */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stopping;
  sreq_t *queue;   /* waiting, in arrival order (preempted ones at the front) */
  sreq_t *running; /* holding a sequence */
  int nrunning;
  sadapter_t *adapters;
  size_t adapter_total;
  uint64_t clock, next_handle, next_order;
  stenant_t *tenants;
  int ntenants, tenants_cap, inflight;
  int next_base; /* round robin over bases with running requests */
  sstats_t st;
};

/* lt_sampler.c: the tenant's row (made when missing; NULL: out of memory). Under mu. */
stenant_t *lt_sampler_tenant(lt_sampler_t *s, const char *tenant);
/* lt_sampler.c: frees a request that left the sampler: its sequence closed, adapter released,
 * tenant count lowered. Under mu. */
void lt_sampler_req_free(lt_sampler_t *s, sreq_t *r);
/* lt_sampler_batch.c: the batch thread. */
void *lt_sampler_batch_main(void *arg);

#endif
