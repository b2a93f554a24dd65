/* lt_engine_sample: KV-cache sampling. Each prompt is prefilled alone, then every unfinished
 * sequence decodes one row per step through the batch-invariant product (mm_nt rowwise), so a
 * sequence's tokens do not depend on which others share its step. Tokens are picked on the host
 * in double from each row's logits with a per-sequence RNG, by lt_picker_pick (lt_serve.c), the
 * picker a served request uses, so both pick identically. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lt_engine_int.h"
#include "lt_serve.h" /* lt_picker_t: the token picker lt_serve's callers use too */

void lt_engine_sampl_free(lt_session_t *s) {
  s->be->free(s->be, s->sp.block);
  memset(&s->sp, 0, sizeof s->sp);
}

/* Sampling buffers for S sequences of up to max_t positions and R rows per forward step; a
 * block at least that large is kept. */
static lt_err_t sampl_ensure(lt_session_t *s, int S, int max_t, int R, char *errstr,
                             size_t errstr_size) {
  sampl_t *p = &s->sp;
  if (p->block && p->S >= S && p->max_t == max_t && p->R >= R) return LT_OK;
  lt_engine_sampl_free(s);
  const lt_model_config_t *c = &s->mc;
  size_t L = (size_t)c->num_layers, D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size,
         QD = (size_t)c->num_heads * c->head_dim, KD = (size_t)c->num_kv_heads * c->head_dim,
         V = (size_t)c->vocab_size, r = s->cfg.full ? 1 : (size_t)s->cfg.rank;
  size_t cache = L * (size_t)S * max_t * KD;
#define SPIECES(X)                                                                             \
  X(kc, cache, float) X(vc, cache, float) X(x, (size_t)R * D, float) X(ln, (size_t)R * D, float) \
  X(q, (size_t)R * QD, float) X(atty, (size_t)R * QD, float) X(k, (size_t)R * KD, float)        \
  X(v, (size_t)R * KD, float) X(g, (size_t)R * F, float) X(u, (size_t)R * F, float)             \
  X(h, (size_t)R * F, float) X(la, (size_t)R * r, float) X(logits, (size_t)S * V, float)        \
  X(tok, (size_t)R, int32_t) X(seq, (size_t)R, int32_t) X(pos, (size_t)R, int32_t)
  size_t total;
  CARVE(SPIECES, s->be, p, total);
#undef SPIECES
  if (!p->block)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "sampling buffers (%.1f MiB): %s",
                   (double)total / (1 << 20), s->be->last_error(s->be));
  p->S = S;
  p->max_t = max_t;
  p->R = R;
  return LT_OK;
}


/* Runs n rows (token, sequence, position already uploaded to sp.tok/seq/pos) through the model,
 * storing their keys and values in the cache; leaves the final normed hidden states in sp.ln. */
static void infer_rows(lt_session_t *s, int n) {
  lt_backend_t *be = s->be;
  sampl_t *p = &s->sp;
  const lt_model_config_t *c = &s->mc;
  const float *cos_tab = s->eng->rope_cos, *sin_tab = s->eng->rope_sin;
  int D = c->hidden_size, F = c->intermediate_size, H = c->num_heads, KV = c->num_kv_heads,
      hd = c->head_dim, KD = KV * hd;
  be->embed_fwd(be, p->x, s->w.embed, p->tok, n, D);
  for (int l = 0; l < c->num_layers; l++) {
    const layer_w_t *lw = &s->w.layer[l];
    float *kc = p->kc + (size_t)l * p->S * p->max_t * KD,
          *vc = p->vc + (size_t)l * p->S * p->max_t * KD;
    be->rmsnorm_fwd(be, p->ln, NULL, p->x, lw->ln1, n, D, c->rms_norm_eps);
    lt_engine_linear_fwd(s, p->ln, n, l, M_Q, p->q, 0.0f, p->la, 0, NULL);
    lt_engine_linear_fwd(s, p->ln, n, l, M_K, p->k, 0.0f, p->la, 0, NULL);
    lt_engine_linear_fwd(s, p->ln, n, l, M_V, p->v, 0.0f, p->la, 0, NULL);
    be->rope(be, p->q, cos_tab, sin_tab, p->pos, n, H, hd, 0);
    be->rope(be, p->k, cos_tab, sin_tab, p->pos, n, KV, hd, 0);
    be->kv_store(be, kc, p->k, p->seq, p->pos, n, KD, p->max_t);
    be->kv_store(be, vc, p->v, p->seq, p->pos, n, KD, p->max_t);
    be->attn_cached(be, p->atty, p->q, kc, vc, p->seq, p->pos, n, H, KV, hd, p->max_t);
    lt_engine_linear_fwd(s, p->atty, n, l, M_O, p->x, 1.0f, p->la, 0, NULL);
    be->rmsnorm_fwd(be, p->ln, NULL, p->x, lw->ln2, n, D, c->rms_norm_eps);
    lt_engine_linear_fwd(s, p->ln, n, l, M_GATE, p->g, 0.0f, p->la, 0, NULL);
    lt_engine_linear_fwd(s, p->ln, n, l, M_UP, p->u, 0.0f, p->la, 0, NULL);
    be->swiglu_fwd(be, p->h, p->g, p->u, (size_t)n * F);
    lt_engine_linear_fwd(s, p->h, n, l, M_DOWN, p->x, 1.0f, p->la, 0, NULL);
  }
  be->rmsnorm_fwd(be, p->ln, NULL, p->x, s->w.norm, n, D, c->rms_norm_eps);
}

/* Checks the request; *maxlen gets the longest prompt. */
static lt_err_t sample_check(const lt_session_t *s, int n, const int32_t *const *prompts,
                             const int *lens, const lt_sample_params_t *sp, int *maxlen,
                             char *errstr, size_t errstr_size) {
  int V = s->mc.vocab_size;
  if (n < 1) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "sample: no prompts");
  if (sp->max_tokens < 1)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "sample: max_tokens %d, expected >= 1",
                   sp->max_tokens);
  if (!(sp->temperature >= 0) || !(sp->top_p > 0 && sp->top_p <= 1) || sp->top_k < 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sample: expected temperature >= 0, top_p in (0, 1], top_k >= 0");
  *maxlen = 0;
  for (int i = 0; i < n; i++) {
    if (lens[i] < 1)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "sample: prompt %d is empty", i);
    for (int j = 0; j < lens[i]; j++)
      if (prompts[i][j] < 0 || prompts[i][j] >= V)
        return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                       "sample: prompt %d token %d = %d is outside the vocabulary [0, %d)", i, j,
                       prompts[i][j], V);
    *maxlen = lens[i] > *maxlen ? lens[i] : *maxlen;
  }
  if (*maxlen + sp->max_tokens > s->eng->rope_len)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sample: prompt (%d) + max_tokens (%d) exceeds the model's %d positions",
                   *maxlen, sp->max_tokens, s->eng->rope_len);
  return LT_OK;
}

/* One lt_sample call: its host buffers and where its answers go. */
typedef struct sample_run {
  const lt_sample_params_t *sp;
  lt_picker_t *pk;              /* [n] one per sequence, sharing pk[0]'s scratch */
  int32_t *htok, *hseq, *hpos;  /* [R] rows of the next forward step */
  int *done, *rows;             /* [n] finished flags; the sequence of each decode row */
  float *lg;                    /* (V) one logits row */
  int32_t *out_tokens;          /* (n, max_tokens) */
  float *out_logp;              /* (n, max_tokens) or NULL */
  int *out_lens;                /* [n] */
} sample_run_t;

/* Uploads the first m host rows (token, sequence, position) and runs them through the model. */
static void sample_rows(lt_session_t *s, const sample_run_t *run, int m) {
  lt_backend_t *be = s->be;
  sampl_t *p = &s->sp;
  be->upload(be, p->tok, run->htok, (size_t)m * sizeof(int32_t));
  be->upload(be, p->seq, run->hseq, (size_t)m * sizeof(int32_t));
  be->upload(be, p->pos, run->hpos, (size_t)m * sizeof(int32_t));
  infer_rows(s, m);
}

/* Picks sequence i's next token from run->lg and appends it; a stop token or max_tokens
 * finishes the sequence. */
static void sample_emit(const lt_session_t *s, sample_run_t *run, int i) {
  const lt_sample_params_t *sp = run->sp;
  float lp;
  int32_t t = lt_picker_pick(&run->pk[i], run->lg, sp, &lp, 0, NULL, NULL);
  size_t at = (size_t)i * sp->max_tokens + run->out_lens[i];
  run->out_tokens[at] = t;
  if (run->out_logp) run->out_logp[at] = lp;
  run->out_lens[i]++;
  for (int k = 0; k < sp->n_stop; k++)
    if (sp->stop[k] == t) run->done[i] = 1;
  if (run->out_lens[i] >= sp->max_tokens) run->done[i] = 1;
}

/* Prefill: each prompt alone, then its first token from the last position's logits. */
static void sample_prefill(lt_session_t *s, sample_run_t *run, int n,
                           const int32_t *const *prompts, const int *lens) {
  lt_backend_t *be = s->be;
  sampl_t *p = &s->sp;
  int V = s->mc.vocab_size, D = s->mc.hidden_size;
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < lens[i]; j++) {
      run->htok[j] = prompts[i][j];
      run->hseq[j] = i;
      run->hpos[j] = j;
    }
    sample_rows(s, run, lens[i]);
    be->matmul(be, 0, 1, 1, V, D, 1.0f, p->ln + (size_t)(lens[i] - 1) * D, D, s->w.lm_head, D,
               0.0f, p->logits, V);
    be->download(be, run->lg, p->logits, (size_t)V * sizeof(float));
    sample_emit(s, run, i);
  }
}

/* Decode: one row per unfinished sequence per step, until every sequence is done. */
static void sample_decode(lt_session_t *s, sample_run_t *run, int n, const int *lens) {
  lt_backend_t *be = s->be;
  sampl_t *p = &s->sp;
  int V = s->mc.vocab_size, D = s->mc.hidden_size, max_tokens = run->sp->max_tokens;
  for (;;) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if (!run->done[i]) {
        run->rows[m] = i;
        run->htok[m] = run->out_tokens[(size_t)i * max_tokens + run->out_lens[i] - 1];
        run->hseq[m] = i;
        run->hpos[m] = lens[i] + run->out_lens[i] - 1;
        m++;
      }
    if (m == 0) break;
    s->rowwise = 1;
    sample_rows(s, run, m);
    lt_engine_mm_nt(s, m, V, D, 1.0f, p->ln, D, s->w.lm_head, D, 0.0f, p->logits, V);
    s->rowwise = 0;
    for (int j = 0; j < m; j++) {
      be->download(be, run->lg, p->logits + (size_t)j * V, (size_t)V * sizeof(float));
      sample_emit(s, run, run->rows[j]);
    }
  }
}

lt_err_t lt_sample(lt_session_t *s, int n, const int32_t *const *prompts, const int *lens,
                   const lt_sample_params_t *sp, int32_t *out_tokens, float *out_logp,
                   int *out_lens, char *errstr, size_t errstr_size) {
  int V = s->mc.vocab_size, maxlen = 0;
  lt_err_t err;
  if ((err = sample_check(s, n, prompts, lens, sp, &maxlen, errstr, errstr_size))) return err;
  int max_t = maxlen + sp->max_tokens;
  int R = maxlen > n ? maxlen : n;
  if ((err = sampl_ensure(s, n, max_t, R, errstr, errstr_size))) return err;
  sample_run_t run = {.sp = sp, .out_tokens = out_tokens, .out_logp = out_logp,
                      .out_lens = out_lens};
  run.pk = calloc((size_t)n, sizeof *run.pk);
  int32_t *h = malloc((size_t)3 * R * sizeof(int32_t));
  run.done = calloc((size_t)n, sizeof(int));
  run.rows = malloc((size_t)n * sizeof(int));
  run.lg = malloc((size_t)V * sizeof(float));
  if (!run.pk || !h || !run.done || !run.rows || !run.lg ||
      lt_picker_init(&run.pk[0], V, sp->seeds ? sp->seeds[0] : sp->seed, NULL, 0)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "sample: out of memory");
    goto out;
  }
  run.htok = h, run.hseq = h + R, run.hpos = h + 2 * R;
  for (int i = 0; i < n; i++) {
    run.pk[i] = run.pk[0];
    lt_picker_reseed(&run.pk[i], sp->seeds ? sp->seeds[i] : sp->seed + (uint64_t)i);
    out_lens[i] = 0;
  }
  sample_prefill(s, &run, n, prompts, lens);
  sample_decode(s, &run, n, lens);
out:
  if (run.pk) lt_picker_free(&run.pk[0]);
  free(run.pk);
  free(h);
  free(run.done);
  free(run.rows);
  free(run.lg);
  return err;
}
