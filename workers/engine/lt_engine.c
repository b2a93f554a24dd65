/* lt_engine: the engine's core, read top to bottom like llm.c's train_gpt2.c: engine open (the
 * parameter table mapped onto the backend, RoPE tables), activations (one allocation per batch
 * shape, each field with its shape), the linear layers with their LoRA path, forward, backward,
 * and the batch primitives (lt_forward_backward, lt_forward, lt_logits).
 *
 * The rest of the engine: lt_engine_config.c (config.json, the parameter table),
 * lt_engine_optim.c (session, trainable parameters, AdamW), lt_engine_state.c (state files,
 * export), lt_engine_sample.c (KV-cache sampling); what they share is in lt_engine_int.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_engine_int.h"

#define ROPE_MAX_POS 16384 /* positions the RoPE tables cover at most */

/* ---- engine ------------------------------------------------------------------------------ */

const lt_model_config_t *lt_engine_config(const lt_engine_t *e) { return &e->cfg; }
lt_backend_t *lt_engine_backend(const lt_engine_t *e) { return e->be; }

static lt_err_t read_file(const char *path, char **buf, size_t *len, char *errstr,
                          size_t errstr_size) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return lt_errf(errstr, errstr_size, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO,
                   "%s: cannot open: %s", path, strerror(errno));
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  if (n < 0 || n > (64l << 20)) {
    fclose(fp);
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: unreadable or larger than 64 MiB",
                   path);
  }
  *buf = malloc((size_t)n + 1);
  if (!*buf) {
    fclose(fp);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: out of memory", path);
  }
  size_t got = fread(*buf, 1, (size_t)n, fp);
  fclose(fp);
  (*buf)[got] = 0;
  *len = got;
  return LT_OK;
}

void lt_engine_close(lt_engine_t *e) {
  if (!e) return;
  for (size_t i = 0; i < e->nspecs; i++) {
    if (*e->specs[i].slot) e->be->free_const(e->be, *e->specs[i].slot);
    if (e->owned) free(e->owned[i]);
  }
  e->be->free(e->be, e->rope_cos);
  e->be->free(e->be, e->rope_sin);
  free(e->owned);
  free(e->specs);
  free(e->w.layer);
  lt_st_close(e->st);
  free(e);
}

/* The weights: every tensor of the table checked for name, dtype and shape and mapped (or
 * converted) onto the backend. Whether q/k/v carry a bias is read from the tensors present
 * (Qwen2 has no config flag for it); an o_proj bias is refused. */
static lt_err_t engine_load_weights(lt_engine_t *e, const char *dir, char *errstr,
                                    size_t errstr_size) {
  lt_backend_t *be = e->be;
  lt_model_config_t *c = &e->cfg;
  lt_err_t err;
  char bname[128];
  snprintf(bname, sizeof bname, "model.layers.0.self_attn.q_proj.bias");
  c->qkv_bias = lt_st_find(e->st, bname) != NULL;
  snprintf(bname, sizeof bname, "model.layers.0.self_attn.o_proj.bias");
  if (lt_st_find(e->st, bname))
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "%s: tensor \"%s\": an o_proj bias is not supported", dir, bname);
  e->w.layer = calloc((size_t)c->num_layers, sizeof *e->w.layer);
  e->specs = calloc(spec_max(c), sizeof *e->specs);
  e->owned = calloc(spec_max(c), sizeof *e->owned);
  if (!e->w.layer || !e->specs || !e->owned)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  size_t ns = lt_engine_spec_build(c, &e->w, e->specs);
  for (size_t i = 0; i < ns; i++) {
    spec_t *s = &e->specs[i];
    const float *data;
    if ((err = lt_st_get_f32(e->st, s->name, s->ndim, s->shape, &data, &e->owned[i], errstr,
                             errstr_size)))
      return err;
    const float *dev = be->map_const(be, data, s->n);
    if (!dev)
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: tensor \"%s\": %s", dir, s->name,
                     be->last_error(be));
    *s->slot = (float *)dev;
    e->nspecs = i + 1;
  }
  if (c->tie_embeddings) e->w.lm_head = e->w.embed;
  if (be->grad_f32) be->grad_f32(be, e->w.lm_head);
  return LT_OK;
}

/* RoPE tables (HF: inv_freq_j = theta^(-2j/hd), angle = pos / factor * inv_freq_j). */
static lt_err_t engine_rope_tables(lt_engine_t *e, char *errstr, size_t errstr_size) {
  lt_backend_t *be = e->be;
  const lt_model_config_t *c = &e->cfg;
  int half = c->head_dim / 2;
  e->rope_len = c->max_position < ROPE_MAX_POS ? c->max_position : ROPE_MAX_POS;
  float *hc = malloc((size_t)e->rope_len * half * sizeof(float));
  float *hs = malloc((size_t)e->rope_len * half * sizeof(float));
  e->rope_cos = be->alloc(be, (size_t)e->rope_len * half * sizeof(float));
  e->rope_sin = be->alloc(be, (size_t)e->rope_len * half * sizeof(float));
  if (!hc || !hs || !e->rope_cos || !e->rope_sin) {
    free(hc);
    free(hs);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "RoPE tables: out of memory");
  }
  for (int p = 0; p < e->rope_len; p++)
    for (int j = 0; j < half; j++) {
      float inv = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * j) / c->head_dim));
      float t = (float)p / c->rope_linear_factor;
      float ang = t * inv; /* float32 as HF computes it */
      hc[(size_t)p * half + j] = (float)cos((double)ang);
      hs[(size_t)p * half + j] = (float)sin((double)ang);
    }
  be->upload(be, e->rope_cos, hc, (size_t)e->rope_len * half * sizeof(float));
  be->upload(be, e->rope_sin, hs, (size_t)e->rope_len * half * sizeof(float));
  free(hc);
  free(hs);
  return LT_OK;
}

lt_err_t lt_model_config_load(const char *dir, lt_model_config_t *out, char *errstr, size_t errstr_size) {
  char path[4096], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/config.json", dir);
  lt_err_t err = read_file(path, &text, &len, errstr, errstr_size);
  if (!err) err = lt_model_config_parse(text, len, path, out, errstr, errstr_size);
  free(text);
  return err;
}

lt_err_t lt_engine_open(const char *dir, lt_backend_t *be, lt_engine_t **out, char *errstr,
                        size_t errstr_size) {
  *out = NULL;
  lt_err_t err;
  lt_engine_t *e = calloc(1, sizeof *e);
  if (!e) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  e->be = be;
  if ((err = lt_model_config_load(dir, &e->cfg, errstr, errstr_size))) goto fail;
  if ((err = lt_st_open_dir(dir, &e->st, errstr, errstr_size)) ||
      (err = engine_load_weights(e, dir, errstr, errstr_size)) ||
      (err = engine_rope_tables(e, errstr, errstr_size)))
    goto fail;
  *out = e;
  return LT_OK;
fail:
  lt_engine_close(e);
  return err;
}

/* ---- activations ------------------------------------------------------------------------- */

void lt_engine_acts_free(lt_session_t *s) {
  acts_t *a = &s->a;
  s->be->free(s->be, a->block);
  free(a->h_targets);
  free(a->h_logp);
  free(a->h_coef);
  memset(a, 0, sizeof *a);
}

/* The per-layer activations of `layers` layers as CARVE pieces, in layer_acts_t's order: the
 * block holds L of each back to back (the residual stream, with L + 1, is listed apart). */
#define LAYER_PIECES(X, layers)                                                                \
  X(ln1, (layers) * N * D, float) X(rstd1, (layers) * N, float)                                \
  X(q, (layers) * N * QD, float) X(k, (layers) * N * KD, float)                                \
  X(v, (layers) * N * KD, float) X(att, (layers) * st, float)                                  \
  X(atty, (layers) * N * QD, float) X(xmid, (layers) * N * D, float)                           \
  X(ln2, (layers) * N * D, float) X(rstd2, (layers) * N, float)                                \
  X(g, (layers) * N * F, float) X(u, (layers) * N * F, float) X(h, (layers) * N * F, float)    \
  X(la, (layers) * M_COUNT * N * r, float)

int lt_engine_head_rows;
size_t lt_engine_act_limit;

/* Rows of logits per chunk for a batch of N rows. */
static size_t head_rows(size_t N) {
  size_t c = lt_engine_head_rows > 0 ? (size_t)lt_engine_head_rows : LT_ENGINE_HEAD_ROWS;
  return N < c ? N : c;
}

int lt_session_recomputes(const lt_session_t *s) { return s->cfg.recompute; }

static lt_err_t acts_ensure(lt_session_t *s, int B, int T, char *errstr, size_t errstr_size) {
  acts_t *a = &s->a;
  if (a->block && a->T == T && B <= a->B_cap && a->head_cap == head_rows((size_t)a->B_cap * T)) {
    /* Fewer rows of the same length (a packed batch): every piece is indexed by a->N, so a
     * prefix of the block serves; nothing is allocated per step. */
    a->B = B;
    a->N = B * T;
    a->state_floats = s->be->attn_state_floats(s->be, B, T, s->mc.num_heads);
    return LT_OK;
  }
  lt_engine_acts_free(s);
  const lt_model_config_t *c = &s->mc;
  lt_backend_t *be = s->be;
  size_t N = (size_t)B * T, L = (size_t)c->num_layers, D = (size_t)c->hidden_size,
         F = (size_t)c->intermediate_size, QD = (size_t)c->num_heads * c->head_dim,
         KD = (size_t)c->num_kv_heads * c->head_dim, V = (size_t)c->vocab_size,
         r = s->cfg.full ? 0 : (size_t)s->cfg.rank;
  size_t st = be->attn_state_floats(be, B, T, c->num_heads);
  size_t LA_ = s->cfg.recompute ? 1 : L; /* layers whose activations the block holds */
  size_t wide = D > F ? D : F;
  wide = wide > QD ? wide : QD;
  size_t dlnw = D > QD ? D : QD;
#define PIECES(X)                                                                              \
  X(tokens, N, int32_t) X(targets, N, int32_t) X(pos, N, int32_t) X(resid, (L + 1) * N * D, float) \
  LAYER_PIECES(X, LA_) X(lnf, N * D, float) X(rstdf, N, float)                                 \
  X(logits, head_rows(N) * V, float) X(lse, N, float) X(logp, N, float) X(coef, N, float)      \
  X(dx, N * D, float) X(dln, N * dlnw, float) X(dq, N * QD, float) X(datty, N * QD, float)     \
  X(dk, N * KD, float) X(dv, N * KD, float) X(dg, N * F, float) X(du, N * F, float)            \
  X(dh, N * F, float) X(dla, N * (r ? r : 1), float) X(scr, N * wide, float)
  size_t total;
  CARVE(PIECES, be, a, total);
#undef PIECES
  if (a->block && lt_engine_act_limit && total > lt_engine_act_limit) {
    be->free(be, a->block);
    a->block = NULL;
  }
  if (!a->block && !s->cfg.recompute) {
    /* Every layer's activations do not fit: keep one layer's and recompute the rest in the
     * backward pass; the same bits, one more forward pass. */
    s->cfg.recompute = 1;
    return acts_ensure(s, B, T, errstr, errstr_size);
  }
  if (!a->block)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM,
                   "activations for batch %d x %d tokens (%.1f MiB): %s", B, T,
                   (double)total / (1 << 20), be->last_error(be));
  a->B = B;
  a->B_cap = B;
  a->T = T;
  a->N = (int)N;
  a->head_cap = head_rows(N);
  a->state_floats = st;
  a->h_targets = malloc(N * sizeof(int32_t));
  a->h_logp = malloc(N * sizeof(float));
  a->h_coef = malloc(N * sizeof(float));
  int32_t *pos = malloc(N * sizeof(int32_t));
  if (!a->h_targets || !a->h_logp || !a->h_coef || !pos) {
    free(pos);
    lt_engine_acts_free(s);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "activations: out of memory");
  }
  for (size_t i = 0; i < N; i++) pos[i] = (int32_t)(i % (size_t)T);
  be->upload(be, a->pos, pos, N * sizeof(int32_t));
  free(pos);
  return LT_OK;
}
/* ---- linear layers (base + bias + LoRA) ---------------------------------------------------- */

void lt_engine_mm_nt(lt_session_t *s, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *W, int ldw, float beta, float *C, int ldc) {
  if (s->rowwise) s->be->matmul_rows(s->be, M, N, K, alpha, A, lda, W, ldw, beta, C, ldc);
  else s->be->matmul(s->be, 0, 1, M, N, K, alpha, A, lda, W, ldw, beta, C, ldc);
}

void lt_engine_linear_fwd(lt_session_t *s, const float *X, int n, int l, int m, float *Y,
                          float beta, float *la, uint64_t dseed, float *scr) {
  lt_backend_t *be = s->be;
  int out, in;
  mod_shape(&s->mc, m, &out, &in);
  const layer_w_t *lw = &s->w.layer[l];
  lt_engine_mm_nt(s, n, out, in, 1.0f, X, in, lw->w[m], in, beta, Y, out);
  if (m <= M_V && lw->b[m]) be->bias_add(be, Y, lw->b[m], n, out);
  if (s->cfg.full) return;
  const lora_t *lo = LORA(s, l, m);
  if (!lo->on) return;
  int r = s->cfg.rank;
  const float *Xd = X;
  if (s->cfg.dropout > 0 && scr) {
    be->dropout(be, scr, X, (size_t)n * in, s->cfg.dropout, dseed);
    Xd = scr;
  }
  lt_engine_mm_nt(s, n, r, in, 1.0f, Xd, in, s->params + lo->off_a, in, 0.0f, la, r);
  lt_engine_mm_nt(s, n, out, r, s->lora_scale, la, r, s->params + lo->off_b, r, 1.0f, Y, out);
}

/* Backward of linear_fwd: dX (n, in) = dY W (+ LoRA path), added to dX's old content times
 * beta_dx; parameter gradients accumulate. */
static void linear_bwd(lt_session_t *s, const float *dY, const float *X, int n, int l, int m,
                       float *dX, float beta_dx, const float *la, uint64_t dseed) {
  lt_backend_t *be = s->be;
  acts_t *a = &s->a;
  int out, in;
  mod_shape(&s->mc, m, &out, &in);
  const layer_w_t *lw = &s->w.layer[l];
  be->matmul(be, 0, 0, n, in, out, 1.0f, dY, out, lw->w[m], in, beta_dx, dX, in);
  if (s->cfg.full) {
    layer_w_t *gl = &s->gw.layer[l];
    be->matmul(be, 1, 0, out, in, n, 1.0f, dY, out, X, in, 1.0f, gl->w[m], in);
    if (m <= M_V && gl->b[m]) be->bias_bwd(be, gl->b[m], dY, n, out);
    return;
  }
  const lora_t *lo = LORA(s, l, m);
  if (!lo->on) return;
  int r = s->cfg.rank;
  float sc = s->lora_scale;
  const float *A = s->params + lo->off_a, *Bm = s->params + lo->off_b;
  float *dA = s->grads + lo->off_a, *dB = s->grads + lo->off_b;
  be->matmul(be, 1, 0, out, r, n, sc, dY, out, la, r, 1.0f, dB, r);      /* dB += s dY^T la */
  be->matmul(be, 0, 0, n, r, out, sc, dY, out, Bm, r, 0.0f, a->dla, r);  /* dla = s dY B */
  if (s->cfg.dropout > 0) {
    float p = s->cfg.dropout;
    be->dropout(be, a->scr, X, (size_t)n * in, p, dseed);
    be->matmul(be, 1, 0, r, in, n, 1.0f, a->dla, r, a->scr, in, 1.0f, dA, in);
    be->matmul(be, 0, 0, n, in, r, 1.0f, a->dla, r, A, in, 0.0f, a->scr, in);
    be->dropout(be, a->scr, a->scr, (size_t)n * in, p, dseed);
    be->axpy(be, dX, 1.0f, a->scr, (size_t)n * in);
  } else {
    be->matmul(be, 1, 0, r, in, n, 1.0f, a->dla, r, X, in, 1.0f, dA, in); /* dA += dla^T X */
    be->matmul(be, 0, 0, n, in, r, 1.0f, a->dla, r, A, in, 1.0f, dX, in); /* dX += dla A */
  }
}

/* ---- forward ----------------------------------------------------------------------------- */

static uint64_t drop_seed(const lt_session_t *s, int l, int m) {
  return mix3(s->cfg.seed, s->fb_calls, (uint64_t)l * M_COUNT + (uint64_t)m);
}

/* One layer's slices of the activation block (see acts_t for their shapes). */
typedef struct layer_acts {
  float *x;                /* resid[l], the layer's input */
  float *ln1, *rstd1;
  float *q, *k, *v;
  float *att, *atty;
  float *xmid, *ln2, *rstd2;
  float *g, *u, *h;
  float *la;               /* (M_COUNT, N, r) */
} layer_acts_t;

static layer_acts_t layer_acts(const lt_session_t *s, int l) {
  const acts_t *a = &s->a;
  const lt_model_config_t *c = &s->mc;
  size_t N = (size_t)a->N, D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size,
         QD = (size_t)c->num_heads * c->head_dim, KD = (size_t)c->num_kv_heads * c->head_dim,
         r = s->cfg.full ? 0 : (size_t)s->cfg.rank, st = a->state_floats;
  /* the pieces of the l layers before this one are its offset */
#define LAYER_AT(name, n, T_) .name = a->name + (n),
  size_t at = s->cfg.recompute ? 0 : (size_t)l; /* recompute: one slot, every layer's in turn */
  return (layer_acts_t){.x = a->resid + (size_t)l * N * D, LAYER_PIECES(LAYER_AT, at)};
#undef LAYER_AT
}

/* Layer l's LoRA scratch of module m, (N, r), in forward and backward. */
#define LA(m) (p.la + (size_t)(m) * N * r)

/* Layer l's forward pass: from resid[l] to its activations and resid[l + 1]. scr: the dropout
 * scratch when training with dropout, else NULL. Run again before the layer's backward pass
 * (cfg.recompute), it computes the same bits: the same inputs, dropout seeds and kernels. */
static void layer_fwd(lt_session_t *s, int l, float *scr) {
  lt_backend_t *be = s->be;
  acts_t *a = &s->a;
  const lt_model_config_t *c = &s->mc;
  const lt_engine_t *e = s->eng;
  int N = a->N, D = c->hidden_size, F = c->intermediate_size, H = c->num_heads,
      KV = c->num_kv_heads, hd = c->head_dim;
  size_t r = s->cfg.full ? 0 : (size_t)s->cfg.rank;
  const layer_w_t *lw = &s->w.layer[l];
  layer_acts_t p = layer_acts(s, l);
  float *xo = p.x + (size_t)N * D;
  be->rmsnorm_fwd(be, p.ln1, p.rstd1, p.x, lw->ln1, N, D, c->rms_norm_eps);
  lt_engine_linear_fwd(s, p.ln1, N, l, M_Q, p.q, 0.0f, LA(M_Q), drop_seed(s, l, M_Q), scr);
  lt_engine_linear_fwd(s, p.ln1, N, l, M_K, p.k, 0.0f, LA(M_K), drop_seed(s, l, M_K), scr);
  lt_engine_linear_fwd(s, p.ln1, N, l, M_V, p.v, 0.0f, LA(M_V), drop_seed(s, l, M_V), scr);
  be->rope(be, p.q, e->rope_cos, e->rope_sin, a->pos, N, H, hd, 0);
  be->rope(be, p.k, e->rope_cos, e->rope_sin, a->pos, N, KV, hd, 0);
  be->attn_fwd(be, p.atty, p.att, p.q, p.k, p.v, a->pos, a->B, a->T, H, KV, hd);
  be->copy(be, p.xmid, p.x, (size_t)N * D);
  lt_engine_linear_fwd(s, p.atty, N, l, M_O, p.xmid, 1.0f, LA(M_O), drop_seed(s, l, M_O),
                       scr);
  be->rmsnorm_fwd(be, p.ln2, p.rstd2, p.xmid, lw->ln2, N, D, c->rms_norm_eps);
  lt_engine_linear_fwd(s, p.ln2, N, l, M_GATE, p.g, 0.0f, LA(M_GATE), drop_seed(s, l, M_GATE),
                       scr);
  lt_engine_linear_fwd(s, p.ln2, N, l, M_UP, p.u, 0.0f, LA(M_UP), drop_seed(s, l, M_UP), scr);
  be->swiglu_fwd(be, p.h, p.g, p.u, (size_t)N * F);
  be->copy(be, xo, p.xmid, (size_t)N * D);
  lt_engine_linear_fwd(s, p.h, N, l, M_DOWN, xo, 1.0f, LA(M_DOWN), drop_seed(s, l, M_DOWN),
                       scr);
}

/* Forward pass over the uploaded tokens of shape (B, T) up to the final norm (the head runs in
 * chunks: head_fwd). */
static void forward(lt_session_t *s, int train) {
  lt_backend_t *be = s->be;
  acts_t *a = &s->a;
  const lt_model_config_t *c = &s->mc;
  int N = a->N, D = c->hidden_size;
  float *scr = train && s->cfg.dropout > 0 ? a->scr : NULL;
  be->embed_fwd(be, a->resid, s->w.embed, a->tokens, N, D);
  for (int l = 0; l < c->num_layers; l++) layer_fwd(s, l, scr);
  be->rmsnorm_fwd(be, a->lnf, a->rstdf, a->resid + (size_t)c->num_layers * N * D, s->w.norm, N,
                  D, c->rms_norm_eps);
}

/* The LM head over rows [n0, n0 + n) of the batch, into a->logits (n <= the chunk rows). */
static void head_fwd(lt_session_t *s, size_t n0, size_t n) {
  int D = s->mc.hidden_size, V = s->mc.vocab_size;
  s->be->matmul(s->be, 0, 1, (int)n, V, D, 1.0f, s->a.lnf + n0 * D, D, s->w.lm_head, D, 0.0f, s->a.logits, V);
}

/* From the chunk's logit gradients (in a->logits) to its rows of dln, and to the LM head's
 * gradient in full training (summed over the chunks in order). */
static void head_bwd(lt_session_t *s, size_t n0, size_t n) {
  lt_backend_t *be = s->be;
  acts_t *a = &s->a;
  int D = s->mc.hidden_size, V = s->mc.vocab_size;
  be->matmul(be, 0, 0, (int)n, D, V, 1.0f, a->logits, V, s->w.lm_head, D, 0.0f, a->dln + n0 * D, D);
  if (s->cfg.full)
    be->matmul(be, 1, 0, V, D, (int)n, 1.0f, a->logits, V, a->lnf + n0 * D, D, 1.0f, s->gw.lm_head, D);
}

/* ---- backward ---------------------------------------------------------------------------- */

/* Backward pass from the gradient of the final norm's output (already in a->dln, head_bwd) to
 * every trainable weight. */
static void backward(lt_session_t *s) {
  lt_backend_t *be = s->be;
  acts_t *a = &s->a;
  const lt_model_config_t *c = &s->mc;
  const lt_engine_t *e = s->eng;
  int N = a->N, D = c->hidden_size, F = c->intermediate_size, H = c->num_heads,
      KV = c->num_kv_heads, hd = c->head_dim, L = c->num_layers,
      full = s->cfg.full;
  size_t r = full ? 0 : (size_t)s->cfg.rank;
  be->zero(be, a->dx, (size_t)N * D);
  be->rmsnorm_bwd(be, a->dx, full ? s->gw.norm : NULL, a->dln, a->resid + (size_t)L * N * D,
                  s->w.norm, a->rstdf, N, D);
  for (int l = L - 1; l >= 0; l--) {
    const layer_w_t *lw = &s->w.layer[l];
    layer_w_t *gl = full ? &s->gw.layer[l] : NULL;
    if (s->cfg.recompute) layer_fwd(s, l, s->cfg.dropout > 0 ? a->scr : NULL);
    layer_acts_t p = layer_acts(s, l);
    /* MLP: resid[l+1] = xmid + down(silu(gate(ln2)) * up(ln2)) */
    linear_bwd(s, a->dx, p.h, N, l, M_DOWN, a->dh, 0.0f, LA(M_DOWN), drop_seed(s, l, M_DOWN));
    be->swiglu_bwd(be, a->dg, a->du, a->dh, p.g, p.u, (size_t)N * F);
    linear_bwd(s, a->dg, p.ln2, N, l, M_GATE, a->dln, 0.0f, LA(M_GATE), drop_seed(s, l, M_GATE));
    linear_bwd(s, a->du, p.ln2, N, l, M_UP, a->dln, 1.0f, LA(M_UP), drop_seed(s, l, M_UP));
    be->rmsnorm_bwd(be, a->dx, gl ? gl->ln2 : NULL, a->dln, p.xmid, lw->ln2, p.rstd2, N, D);
    /* attention: xmid = x + o(attn(rope(q(ln1)), rope(k(ln1)), v(ln1))) */
    linear_bwd(s, a->dx, p.atty, N, l, M_O, a->datty, 0.0f, LA(M_O), drop_seed(s, l, M_O));
    be->attn_bwd(be, a->dq, a->dk, a->dv, a->datty, p.q, p.k, p.v, p.atty, p.att, a->pos, a->B,
                 a->T, H, KV, hd);
    be->rope(be, a->dq, e->rope_cos, e->rope_sin, a->pos, N, H, hd, 1);
    be->rope(be, a->dk, e->rope_cos, e->rope_sin, a->pos, N, KV, hd, 1);
    linear_bwd(s, a->dq, p.ln1, N, l, M_Q, a->dln, 0.0f, LA(M_Q), drop_seed(s, l, M_Q));
    linear_bwd(s, a->dk, p.ln1, N, l, M_K, a->dln, 1.0f, LA(M_K), drop_seed(s, l, M_K));
    linear_bwd(s, a->dv, p.ln1, N, l, M_V, a->dln, 1.0f, LA(M_V), drop_seed(s, l, M_V));
    be->rmsnorm_bwd(be, a->dx, gl ? gl->ln1 : NULL, a->dln, p.x, lw->ln1, p.rstd1, N, D);
  }
  if (full) be->embed_bwd(be, s->gw.embed, a->dx, a->tokens, N, D);
#undef LA
}

/* ---- the primitives ---------------------------------------------------------------------- */

/* The policy-gradient losses' inputs (LT_LOSS_IMPORTANCE, LT_LOSS_PPO): advantages and
 * sampler_logp present and finite where a token counts, and PPO's clip range. */
static lt_err_t check_policy_inputs(const lt_batch_t *b, lt_loss_t loss, char *errstr,
                                    size_t errstr_size) {
  const char *name = loss == LT_LOSS_PPO ? "PPO" : "importance-sampling";
  if (!b->advantages || !b->sampler_logp)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "batch: the %s loss needs advantages and sampler_logp (%s missing)", name,
                   !b->advantages ? "advantages" : "sampler_logp");
  if (loss == LT_LOSS_PPO) {
    const float clip[2] = {b->clip_low, b->clip_high};
    for (int k = 0; k < 2; k++)
      if (!isfinite(clip[k]) || !(clip[k] >= 0 && clip[k] < 10))
        return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                       "batch: %s = %g, expected a finite value in [0, 10) (0: 0.2)",
                       k ? "clip_high" : "clip_low", (double)clip[k]);
  }
  size_t N = (size_t)b->B * b->T;
  for (size_t i = 0; i < N; i++) {
    if (b->weights && b->weights[i] == 0) continue;
    const char *bad = !isfinite(b->advantages[i])     ? "advantages"
                      : !isfinite(b->sampler_logp[i]) ? "sampler_logp"
                                                      : NULL;
    if (bad)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "batch: %s[%zu][%zu] = %g, expected a finite value", bad, i / (size_t)b->T,
                     i % (size_t)b->T,
                     (double)(bad[0] == 'a' ? b->advantages[i] : b->sampler_logp[i]));
  }
  return LT_OK;
}

static lt_err_t check_batch(const lt_session_t *s, const lt_batch_t *b, lt_loss_t loss,
                            int need_targets, char *errstr, size_t errstr_size) {
  int V = s->mc.vocab_size;
  if (b->B < 1 || b->T < 1)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "batch: B=%d T=%d, both must be >= 1",
                   b->B, b->T);
  if (b->T > s->eng->rope_len)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "batch: sequence length %d exceeds the model's %d positions", b->T,
                   s->eng->rope_len);
  if (!b->tokens)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "batch: tokens missing");
  size_t N = (size_t)b->B * b->T;
  for (size_t i = 0; i < N; i++)
    if (b->tokens[i] < 0 || b->tokens[i] >= V)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "batch: tokens[%zu][%zu] = %d is outside the vocabulary [0, %d)",
                     i / (size_t)b->T, i % (size_t)b->T, b->tokens[i], V);
  if (b->positions)
    for (size_t i = 0; i < N; i++) {
      size_t t = i % (size_t)b->T;
      int32_t p = b->positions[i];
      /* Each row is a run of examples, each counting 0, 1, 2, ... from its first token. */
      if (!(p == 0 || (t > 0 && p == b->positions[i - 1] + 1)))
        return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                       "batch: positions[%zu][%zu] = %d; expected 0 (an example starts) or %d (it goes on)",
                       i / (size_t)b->T, t, p, t > 0 ? b->positions[i - 1] + 1 : 0);
    }
  if (!need_targets) return LT_OK;
  if (!b->targets)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "batch: targets missing");
  if (loss != LT_LOSS_CROSS_ENTROPY && loss != LT_LOSS_IMPORTANCE && loss != LT_LOSS_PPO)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "loss %d: unknown", (int)loss);
  double W = 0;
  for (size_t i = 0; i < N; i++) {
    float w = b->weights ? b->weights[i] : 1.0f;
    if (!(w >= 0) || !isfinite(w))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "batch: weights[%zu][%zu] = %g, expected a finite value >= 0",
                     i / (size_t)b->T, i % (size_t)b->T, (double)w);
    if (w != 0 && (b->targets[i] < 0 || b->targets[i] >= V))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "batch: targets[%zu][%zu] = %d is outside the vocabulary [0, %d)",
                     i / (size_t)b->T, i % (size_t)b->T, b->targets[i], V);
    W += w;
  }
  if (!(W > 0))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "batch: every token has weight 0, there is nothing to learn from");
  if (loss == LT_LOSS_CROSS_ENTROPY) return LT_OK;
  return check_policy_inputs(b, loss, errstr, errstr_size);
}

/* One token's term of the loss (before the -w / W factor) and its derivative with respect to
 * the token's log-prob lp, in double. */
static double token_term(const lt_batch_t *b, lt_loss_t loss, size_t i, double lp,
                         double *dterm) {
  if (loss == LT_LOSS_CROSS_ENTROPY) {
    *dterm = 1;
    return lp;
  }
  double ratio = exp(lp - (double)b->sampler_logp[i]), adv = b->advantages[i];
  *dterm = ratio * adv;
  if (loss == LT_LOSS_IMPORTANCE) return ratio * adv;
  double lo = 1.0 - (b->clip_low > 0 ? (double)b->clip_low : 0.2),
         hi = 1.0 + (b->clip_high > 0 ? (double)b->clip_high : 0.2);
  double clipped = ratio < lo ? lo : ratio > hi ? hi : ratio;
  /* min(r A, clip(r) A): on a tie (r inside the range) the unclipped term, whose gradient is
   * the importance-sampling one; otherwise the clipped term, a constant. */
  if (ratio * adv <= clipped * adv) return ratio * adv;
  *dterm = 0;
  return clipped * adv;
}

/* Puts the batch's positions (or t = 0..T-1 in every row) where RoPE and attention read them;
 * the default is uploaded again, for every row the block holds, only after a batch that brought
 * its own. */
static lt_err_t acts_positions(lt_session_t *s, const int32_t *positions, char *errstr, size_t errstr_size) {
  acts_t *a = &s->a;
  if (positions) {
    a->pos_custom = 1;
    return s->be->upload(s->be, a->pos, positions, (size_t)a->N * sizeof(int32_t));
  }
  if (!a->pos_custom) return LT_OK;
  size_t N = (size_t)a->B_cap * a->T;
  int32_t *pos = malloc(N * sizeof(int32_t));
  if (!pos) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "positions: out of memory");
  for (size_t i = 0; i < N; i++) pos[i] = (int32_t)(i % (size_t)a->T);
  lt_err_t err = s->be->upload(s->be, a->pos, pos, N * sizeof(int32_t));
  free(pos);
  a->pos_custom = 0;
  return err;
}

/* The most likely next token of each of the n rows of logits the head just wrote (the first
 * of equal ones), a row at a time through one row of host memory: never the chunk's n x V. */
static lt_err_t chunk_argmax(lt_session_t *s, int32_t *out, size_t n, char *errstr, size_t errstr_size) {
  int V = s->mc.vocab_size;
  float *row = malloc((size_t)V * sizeof *row);
  if (!row) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory for a row of %d logits", V);
  lt_err_t err = LT_OK;
  for (size_t i = 0; i < n && !err; i++) {
    if ((err = s->be->download(s->be, row, s->a.logits + i * (size_t)V, (size_t)V * sizeof(float)))) break;
    int arg = 0;
    for (int v = 1; v < V; v++)
      if (row[v] > row[arg]) arg = v;
    out[i] = arg;
  }
  free(row);
  return err;
}

/* Forward (+ backward when train) of a batch with a loss. */
static lt_err_t run_batch(lt_session_t *s, const lt_batch_t *b, lt_loss_t loss, int train,
                          float *loss_out, float *logp_out, int32_t *argmax_out, char *errstr,
                          size_t errstr_size) {
  lt_err_t err;
  if ((err = check_batch(s, b, loss, 1, errstr, errstr_size))) return err;
  if ((err = acts_ensure(s, b->B, b->T, errstr, errstr_size))) return err;
  lt_backend_t *be = s->be;
  acts_t *a = &s->a;
  size_t N = (size_t)a->N;
  for (size_t i = 0; i < N; i++) {
    int32_t t = b->targets[i];
    a->h_targets[i] = t >= 0 && t < s->mc.vocab_size ? t : 0; /* masked rows may hold -100 */
  }
  if ((err = acts_positions(s, b->positions, errstr, errstr_size))) return err;
  be->upload(be, a->tokens, b->tokens, N * sizeof(int32_t));
  be->upload(be, a->targets, a->h_targets, N * sizeof(int32_t));
  forward(s, train);
  /* The head, the loss and its gradient chunk by chunk (LT_ENGINE_HEAD_ROWS); the loss and its
   * derivative wrt each log-prob on the host in double, in row order. */
  double W = 0, Ls = 0;
  int finite = 1; /* every token's coefficient: an overflowed one would poison the gradients */
  for (size_t i = 0; i < N; i++) W += b->weights ? b->weights[i] : 1.0f;
  int V = s->mc.vocab_size;
  for (size_t n0 = 0, n; n0 < N; n0 += n) {
    n = head_rows(N) < N - n0 ? head_rows(N) : N - n0;
    head_fwd(s, n0, n);
    be->ce_fwd(be, a->logp + n0, a->lse + n0, a->logits, a->targets + n0, (int)n, V);
    be->download(be, a->h_logp + n0, a->logp + n0, n * sizeof(float));
    if (argmax_out && (err = chunk_argmax(s, argmax_out + n0, n, errstr, errstr_size))) return err;
    for (size_t i = n0; i < n0 + n; i++) {
      double w = b->weights ? b->weights[i] : 1.0f, lp = a->h_logp[i];
      if (w == 0) {
        a->h_coef[i] = 0;
        continue;
      }
      double dterm, term = token_term(b, loss, i, lp, &dterm);
      Ls += -w * term;
      a->h_coef[i] = (float)(-w * dterm / W);
      finite = finite && isfinite(a->h_coef[i]);
    }
    if (!train) continue;
    be->upload(be, a->coef + n0, a->h_coef + n0, n * sizeof(float));
    be->ce_bwd(be, a->logits, a->lse + n0, a->targets + n0, a->coef + n0, (int)n, V);
    head_bwd(s, n0, n);
  }
  if (loss_out) *loss_out = (float)(Ls / W);
  if (logp_out) memcpy(logp_out, a->h_logp, N * sizeof(float));
  if (!(finite && isfinite(Ls) && (W == 0 || isfinite((float)(Ls / W))))) {
    if (train && s->cfg.full) { /* the head's chunks added to lm_head's gradient already */
      be->zero(be, s->grads, s->nparams);
      s->accum = 0;
    }
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "the loss is not finite (%g): the batch's log-probs and advantages overflow it (an importance "
                   "ratio exp(logprob - sampler logprob) past float's range); %s",
                   Ls / W, train && s->cfg.full ? "the gradients since the last step were dropped" : "no gradient was kept");
  }
  if (!train) return LT_OK;
  backward(s);
  s->accum++;
  s->fb_calls++;
  return LT_OK;
}

lt_err_t lt_forward_backward(lt_session_t *s, const lt_batch_t *b, lt_loss_t loss,
                             float *loss_out, float *logp_out, char *errstr,
                             size_t errstr_size) {
  return run_batch(s, b, loss, 1, loss_out, logp_out, NULL, errstr, errstr_size);
}

lt_err_t lt_forward(lt_session_t *s, const lt_batch_t *b, lt_loss_t loss, float *loss_out,
                    float *logp_out, char *errstr, size_t errstr_size) {
  return run_batch(s, b, loss, 0, loss_out, logp_out, NULL, errstr, errstr_size);
}

lt_err_t lt_eval_tokens(lt_session_t *s, const lt_batch_t *b, float *logp_out, int32_t *argmax_out,
                        char *errstr, size_t errstr_size) {
  return run_batch(s, b, LT_LOSS_CROSS_ENTROPY, 0, NULL, logp_out, argmax_out, errstr, errstr_size);
}

lt_err_t lt_logits(lt_session_t *s, int B, int T, const int32_t *tokens, float *logits_out,
                   char *errstr, size_t errstr_size) {
  lt_batch_t b = {.B = B, .T = T, .tokens = tokens};
  lt_err_t err;
  if ((err = check_batch(s, &b, LT_LOSS_CROSS_ENTROPY, 0, errstr, errstr_size))) return err;
  if ((err = acts_ensure(s, B, T, errstr, errstr_size))) return err;
  if ((err = acts_positions(s, NULL, errstr, errstr_size))) return err;
  s->be->upload(s->be, s->a.tokens, tokens, (size_t)B * T * sizeof(int32_t));
  forward(s, 0);
  size_t N = (size_t)B * T, V = (size_t)s->mc.vocab_size;
  for (size_t n0 = 0, n; n0 < N; n0 += n) {
    n = head_rows(N) < N - n0 ? head_rows(N) : N - n0;
    head_fwd(s, n0, n);
    if ((err = s->be->download(s->be, logits_out + n0 * V, s->a.logits, n * V * sizeof(float)))) return err;
  }
  return LT_OK;
}
