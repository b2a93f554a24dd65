/* lt_engine_optim: a session's trainable parameters and their update. A session trains either
 * LoRA adapters (A (r, in) and B (out, r) for each targeted module of each layer, packed in one
 * flat buffer) or, in full mode, a private copy of every weight laid out as the parameter table.
 * Either way the parameters, their gradients and the AdamW moments are four flat buffers of
 * nparams floats, which is what lt_optim_step and the state files walk. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lt_engine_int.h"

long lt_session_step(const lt_session_t *s) { return s->step; }
size_t lt_session_num_params(const lt_session_t *s) { return s->nparams; }

float *lt_session_grad_buffer(lt_session_t *s, size_t *n) {
  if (n) *n = s->nparams;
  return s->grads;
}

lt_err_t lt_session_set_accum(lt_session_t *s, long micro_batches, char *errstr,
                              size_t errstr_size) {
  if (micro_batches < 1)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "set_accum: %ld micro-batches: expected >= 1 (the ranks whose gradients the "
                   "buffer sums)", micro_batches);
  s->accum = micro_batches;
  return LT_OK;
}

uint64_t lt_session_call_index(const lt_session_t *s) { return s->fb_calls; }

void lt_session_set_call_index(lt_session_t *s, uint64_t calls) { s->fb_calls = calls; }

void lt_session_destroy(lt_session_t *s) {
  if (!s) return;
  lt_engine_acts_free(s);
  lt_engine_sampl_free(s);
  s->be->free(s->be, s->params);
  s->be->free(s->be, s->grads);
  s->be->free(s->be, s->m);
  s->be->free(s->be, s->v);
  free(s->w.layer);
  free(s->gw.layer);
  free(s->specs);
  free(s->gspecs);
  free(s->lora);
  free(s);
}

/* The LoRA hyper-parameters a session may take (a full session ignores them). */
static lt_err_t session_check_config(const lt_session_config_t *cfg, char *errstr,
                                     size_t errstr_size) {
  if (cfg->full) return LT_OK;
  if (cfg->rank < 1 || cfg->rank > 4096)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "lora rank %d: expected 1..4096",
                   cfg->rank);
  if (!(cfg->alpha > 0))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "lora alpha %g: expected > 0",
                   (double)cfg->alpha);
  if (!(cfg->dropout >= 0 && cfg->dropout < 1))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "lora dropout %g: expected [0, 1)",
                   (double)cfg->dropout);
  if (!(cfg->targets & LT_TARGET_ALL) || (cfg->targets & ~(unsigned)LT_TARGET_ALL))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "lora targets 0x%x: expected a non-empty set of q,k,v,o,gate,up,down",
                   cfg->targets);
  return LT_OK;
}

/* Full mode: the weight and gradient tables; nparams is every weight. -1 when out of memory. */
static int session_layout_full(lt_session_t *s) {
  const lt_model_config_t *c = &s->mc;
  int L = c->num_layers;
  s->w.layer = calloc((size_t)L, sizeof *s->w.layer);
  s->gw.layer = calloc((size_t)L, sizeof *s->gw.layer);
  s->specs = calloc(spec_max(c), sizeof *s->specs);
  s->gspecs = calloc(spec_max(c), sizeof *s->gspecs);
  if (!s->w.layer || !s->gw.layer || !s->specs || !s->gspecs) return -1;
  s->nspecs = lt_engine_spec_build(c, &s->w, s->specs);
  lt_engine_spec_build(c, &s->gw, s->gspecs);
  for (size_t i = 0; i < s->nspecs; i++) s->nparams += s->specs[i].n;
  return 0;
}

/* LoRA: the engine's weights, and where each targeted module's A and B sit in the flat buffer.
 * -1 when out of memory. */
static int session_layout_lora(lt_session_t *s) {
  const lt_engine_t *eng = s->eng;
  const lt_session_config_t *cfg = &s->cfg;
  int L = s->mc.num_layers;
  s->w = eng->w; /* shares the engine's layer array: read-only */
  s->w.layer = calloc((size_t)L, sizeof *s->w.layer);
  s->lora = calloc((size_t)L * M_COUNT, sizeof *s->lora);
  if (!s->w.layer || !s->lora) return -1;
  memcpy(s->w.layer, eng->w.layer, (size_t)L * sizeof *s->w.layer);
  s->lora_scale = cfg->alpha / (float)cfg->rank;
  for (int l = 0; l < L; l++)
    for (int m = 0; m < M_COUNT; m++) {
      lora_t *lo = LORA(s, l, m);
      if (!(cfg->targets & (1u << m))) continue;
      lo->on = 1;
      mod_shape(&s->mc, m, &lo->out, &lo->in);
      lo->off_a = s->nparams;
      s->nparams += (size_t)cfg->rank * lo->in;
      lo->off_b = s->nparams;
      s->nparams += (size_t)lo->out * cfg->rank;
    }
  return 0;
}

/* Full mode: points both tables into the flat buffers and copies the engine's weights in. */
static void session_init_full(lt_session_t *s) {
  lt_backend_t *be = s->be;
  const lt_engine_t *eng = s->eng;
  size_t off = 0;
  for (size_t i = 0; i < s->nspecs; i++) {
    *s->specs[i].slot = s->params + off;
    *s->gspecs[i].slot = s->grads + off;
    be->copy(be, s->params + off, *eng->specs[i].slot, s->specs[i].n);
    off += s->specs[i].n;
  }
  if (s->mc.tie_embeddings) {
    s->w.lm_head = s->w.embed;
    s->gw.lm_head = s->gw.embed;
  }
}

/* LoRA: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT: kaiming_uniform_(a=sqrt(5))), B = 0, drawn from
 * the session's RNG in layer and module order. -1 when out of memory. */
static int session_init_lora(lt_session_t *s) {
  size_t bytes = s->nparams * sizeof(float);
  float *host = malloc(bytes ? bytes : 1);
  if (!host) return -1;
  memset(host, 0, bytes);
  for (int l = 0; l < s->mc.num_layers; l++)
    for (int m = 0; m < M_COUNT; m++) {
      lora_t *lo = LORA(s, l, m);
      if (!lo->on) continue;
      double bound = 1.0 / sqrt((double)lo->in);
      for (size_t i = 0; i < (size_t)s->cfg.rank * lo->in; i++)
        host[lo->off_a + i] = (float)((2.0 * rng_uniform(&s->rng) - 1.0) * bound);
    }
  s->be->upload(s->be, s->params, host, bytes);
  free(host);
  return 0;
}

lt_err_t lt_session_new(lt_engine_t *eng, const lt_session_config_t *cfg, lt_session_t **out,
                        char *errstr, size_t errstr_size) {
  *out = NULL;
  lt_err_t err = session_check_config(cfg, errstr, errstr_size);
  if (err) return err;
  lt_backend_t *be = eng->be;
  lt_session_t *s = calloc(1, sizeof *s);
  if (!s) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  s->eng = eng;
  s->be = be;
  s->cfg = *cfg;
  s->mc = eng->cfg;
  rng_seed(&s->rng, cfg->seed);
  if (cfg->full ? session_layout_full(s) : session_layout_lora(s)) goto oom;
  size_t bytes = s->nparams * sizeof(float);
  s->params = be->alloc(be, bytes);
  s->grads = be->alloc(be, bytes);
  s->m = be->alloc(be, bytes);
  s->v = be->alloc(be, bytes);
  if (!s->params || !s->grads || !s->m || !s->v) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "session: %zu parameters: %s", s->nparams,
                  be->last_error(be));
    goto fail;
  }
  if (cfg->full) session_init_full(s);
  else if (session_init_lora(s)) goto oom;
  *out = s;
  return LT_OK;
oom:
  err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "session: out of memory");
fail:
  lt_session_destroy(s);
  return err;
}

/* ---- the optimizer ------------------------------------------------------------------------- */

lt_err_t lt_optim_step(lt_session_t *s, const lt_adamw_t *o, float *grad_norm_out, char *errstr,
                       size_t errstr_size) {
  if (s->accum == 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "optim_step: no forward_backward since the last step, no gradient to apply");
  if (!(o->lr >= 0) || !(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) ||
      !(o->eps > 0) || !(o->weight_decay >= 0) || !((double)o->lr * o->weight_decay <= 1 + 1e-6))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "optim_step: expected lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0 and lr x "
                   "weight_decay <= 1 (each step scales the weights by 1 - lr x weight_decay)");
  lt_backend_t *be = s->be;
  double inv = 1.0 / (double)s->accum;
  double norm = sqrt(be->sumsq(be, s->grads, s->nparams)) * inv;
  if (!isfinite(norm)) { /* applied, they would make every weight NaN */
    be->zero(be, s->grads, s->nparams);
    s->accum = 0;
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "optim_step: the accumulated gradients are not finite: the step was not taken and they were "
                   "dropped");
  }
  double clip = 1.0;
  if (o->max_grad_norm > 0 && norm > o->max_grad_norm)
    clip = o->max_grad_norm / (norm + 1e-6); /* as torch.nn.utils.clip_grad_norm_ */
  s->step++;
  be->adamw(be, s->params, s->grads, s->m, s->v, s->nparams, o->lr, o->beta1, o->beta2, o->eps,
            o->weight_decay, (float)(inv * clip), s->step);
  be->zero(be, s->grads, s->nparams);
  s->accum = 0;
  if (grad_norm_out) *grad_norm_out = (float)norm;
  return LT_OK;
}
