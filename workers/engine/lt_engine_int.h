/* lt_engine_int.h: what the engine's files share and nothing outside them may use.
 *
 * The engine is split by phase of a training run (docs/STYLE.md: a private header per
 * subsystem): lt_engine_config.c (config.json, the parameter table), lt_engine.c (engine open,
 * activations, forward, backward, the batch primitives), lt_engine_optim.c (session: trainable
 * parameters, their initialisation and the AdamW step), lt_engine_state.c (state files, PEFT
 * and full-model export, random models) and lt_engine_sample.c (KV-cache sampling). This header
 * holds the structures they all read: the weight table, the session, its activation and
 * sampling buffers, and the RNG. */
#ifndef LT_ENGINE_INT_H
#define LT_ENGINE_INT_H

#include <math.h>
#include <stdint.h>

#include "lt_engine.h"
#include "lt_rand.h"
#include "lt_safetensors.h"

/* ---- RNG: xoshiro256** seeded by SplitMix64 ------------------------------------------------ */

typedef struct rng {
  uint64_t s[4];
} rng_t;

static inline uint64_t splitmix64(uint64_t *x) { return lt_splitmix64(x); }

static inline void rng_seed(rng_t *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng_t *r) {
  uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return res;
}

/* uniform in [0, 1) with 53 bits */
static inline double rng_uniform(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

static inline double rng_normal(rng_t *r) {
  double u1 = rng_uniform(r), u2 = rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static inline uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a ^ rotl(b, 21) ^ rotl(c, 42);
  return splitmix64(&x);
}

/* ---- the parameter table ------------------------------------------------------------------ */

/* The seven linear modules of a layer, in LoRA target-bit order (LT_TARGET_Q is 1 << M_Q). */
enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_COUNT };
extern const char *const lt_engine_mod_name[M_COUNT];   /* "q_proj", ... (HF names) */
extern const char *const lt_engine_mod_parent[M_COUNT]; /* "self_attn" or "mlp" */

/* Pointers to every weight (device memory). The engine's are read-only mappings (the cast away
 * from const is never written through); a full-mode session has a writable set and a gradient
 * set of the same layout. */
typedef struct layer_w {
  float *ln1;       /* (D) input_layernorm */
  float *w[M_COUNT]; /* q (H*hd, D), k (KV*hd, D), v (KV*hd, D), o (D, H*hd),
                        gate (F, D), up (F, D), down (D, F) */
  float *b[3];      /* q, k, v biases (H*hd), (KV*hd), (KV*hd), or NULL */
  float *ln2;       /* (D) post_attention_layernorm */
} layer_w_t;

typedef struct weights {
  float *embed;     /* (V, D) */
  layer_w_t *layer; /* [L] */
  float *norm;      /* (D) */
  float *lm_head;   /* (V, D); == embed when tied */
} weights_t;

/* One weight: its HF name, shape, element count and the slot in a weights_t that points at it. */
typedef struct spec {
  char name[96];
  int ndim;
  int64_t shape[2];
  size_t n;
  float **slot;
} spec_t;

/* (out, in) of module m's weight. */
static inline void mod_shape(const lt_model_config_t *c, int m, int *out, int *in) {
  int D = c->hidden_size, F = c->intermediate_size, qd = c->num_heads * c->head_dim,
      kvd = c->num_kv_heads * c->head_dim;
  switch (m) {
    case M_Q: *out = qd, *in = D; break;
    case M_K:
    case M_V: *out = kvd, *in = D; break;
    case M_O: *out = D, *in = qd; break;
    case M_GATE:
    case M_UP: *out = F, *in = D; break;
    default: *out = D, *in = F; break;
  }
}

/* Entries lt_engine_spec_build writes at most. */
static inline size_t spec_max(const lt_model_config_t *c) {
  return 3 + (size_t)c->num_layers * 12;
}

/* Every weight of the model with its HF name, in file order, each entry pointing at its slot
 * in *w (w->layer must be allocated). Returns the count. */
size_t lt_engine_spec_build(const lt_model_config_t *c, weights_t *w, spec_t *s);

/* ---- engine and session ------------------------------------------------------------------- */

/* A loaded base model: read-only after lt_engine_open, shared by its sessions. */
struct lt_engine {
  lt_backend_t *be;
  lt_model_config_t cfg;
  lt_st_t *st;
  weights_t w;
  spec_t *specs;
  size_t nspecs;
  float **owned; /* converted host copies (F16/BF16), parallel to specs; NULL where mapped */
  float *rope_cos, *rope_sin; /* (rope_len, hd/2) device */
  int rope_len;
};

/* One module's LoRA adapter: where A and B sit in the session's flat buffers. */
typedef struct lora {
  int on, in, out; /* targeted; the module's in and out features */
  size_t off_a, off_b; /* offsets in the adapter buffers: A (r, in), B (out, r) */
} lora_t;

/* Activations of one (B, T) shape, one backend allocation (sizes in floats unless int32). */
/* Rows of logits the engine holds at once: the LM head, the loss and its gradient run over the
 * batch in chunks of this many rows, so N x V logits never exist (4096 x 49152 floats would be
 * 805 MB; 256 rows are 50 MB). lt_engine_head_rows overrides it (tests; 0: this default). */
#define LT_ENGINE_HEAD_ROWS 256
extern int lt_engine_head_rows;

/* Tests: an activation block larger than this many bytes is taken as one the backend could not
 * allocate (0: no limit), to reach the fallback to per-layer recompute without exhausting
 * memory. */
extern size_t lt_engine_act_limit;

typedef struct acts {
  int B, T, N;
  int B_cap;      /* rows the block was carved for: a batch of B <= B_cap rows of T reuses it */
  size_t head_cap; /* rows of logits the block holds (head_rows of B_cap * T) */
  int pos_custom; /* a->pos holds a batch's own positions (packing), not t = 0..T-1 */
  int32_t *tokens, *targets, *pos; /* (N) */
  float *resid;   /* (L+1, N, D) resid[l] is the input of layer l, resid[L] the last output */
  float *ln1;     /* (L, N, D) */
  float *rstd1;   /* (L, N) */
  float *q;       /* (L, N, H*hd) after RoPE */
  float *k, *v;   /* (L, N, KV*hd), k after RoPE */
  float *att;     /* (L, attn_state_floats) */
  float *atty;    /* (L, N, H*hd) attention output */
  float *xmid;    /* (L, N, D) resid + attention */
  float *ln2;     /* (L, N, D) */
  float *rstd2;   /* (L, N) */
  float *g, *u, *h; /* (L, N, F) gate, up, silu(gate) * up */
  float *la;      /* (L, M_COUNT, N, r) LoRA x A^T */
  float *lnf;     /* (N, D) */
  float *rstdf;   /* (N) */
  float *logits;  /* (min(N, LT_ENGINE_HEAD_ROWS), V): one chunk of rows at a time, becomes
                   * that chunk's dlogits in the backward pass */
  float *lse, *logp, *coef; /* (N) */
  /* backward scratch, reused by every layer */
  float *dx;      /* (N, D) gradient of the residual stream */
  float *dln;     /* (N, max(D, H*hd)) */
  float *dq, *datty; /* (N, H*hd) */
  float *dk, *dv; /* (N, KV*hd) */
  float *dg, *du, *dh; /* (N, F) */
  float *dla;     /* (N, r) */
  float *scr;     /* (N, max(D, F, H*hd)) dropout scratch */
  /* host mirrors */
  int32_t *h_targets;
  float *h_logp, *h_coef;
  size_t state_floats;
  void *block;
} acts_t;

/* Sampling buffers: KV cache and rows of one forward step. */
typedef struct sampl {
  int S, max_t, R; /* sequences, cache length, rows */
  float *kc, *vc;  /* (L, S, max_t, KV*hd) */
  float *x, *ln;   /* (R, D) */
  float *q, *atty; /* (R, H*hd) */
  float *k, *v;    /* (R, KV*hd) */
  float *g, *u, *h; /* (R, F) */
  float *la;       /* (R, r) */
  float *logits;   /* (S, V) */
  int32_t *tok, *seq, *pos; /* (R) */
  void *block;
} sampl_t;

/* One training run on an engine (see lt_engine.h). */
struct lt_session {
  lt_engine_t *eng;
  lt_backend_t *be;
  lt_session_config_t cfg;
  lt_model_config_t mc;
  weights_t w;    /* weights in use: the engine's (LoRA) or the session's copy (full) */
  weights_t gw;   /* full mode: gradients (same layout) */
  spec_t *specs;  /* full mode: the table of w, and of gw (gspecs) */
  spec_t *gspecs;
  size_t nspecs;
  lora_t *lora;   /* [L][M_COUNT] */
  float lora_scale;
  /* trainable parameters, their gradients and AdamW moments: 4 buffers of nparams floats */
  size_t nparams;
  float *params, *grads, *m, *v;
  long step;
  long accum;     /* forward_backward calls since the last optim_step */
  uint64_t fb_calls;
  rng_t rng;
  int rowwise;    /* sampling decode: batch-invariant products (mm_nt) */
  acts_t a;
  sampl_t sp;
};

/* The adapter of layer l's module m. */
#define LORA(s, l, m) (&(s)->lora[(size_t)(l) * M_COUNT + (m)])

/* Activation and sampling blocks are one backend allocation each, carved into 64-byte-aligned
 * pieces by an X-macro list of (field, count, type). CARVE(LIST, be, dst, total) allocates
 * dst->block from backend be, points each listed field of *dst at its piece and sets `total`
 * to the block's bytes; dst->block is NULL when the allocation failed. */
#define CARVE_BYTES(n, T_) ((((n) * sizeof(T_)) + 63) & ~(size_t)63)
#define CARVE_COUNT(name, n, T_) carve_total += CARVE_BYTES(n, T_);
#define CARVE_TAKE(name, n, T_)                                                                \
  carve_dst->name = (T_ *)(void *)carve_cur;                                                   \
  carve_cur += CARVE_BYTES(n, T_);
#define CARVE(LIST, be, dst, total)                                                            \
  do {                                                                                         \
    size_t carve_total = 0;                                                                    \
    LIST(CARVE_COUNT)                                                                          \
    __typeof__(dst) carve_dst = (dst);                                                         \
    char *carve_cur = (be)->alloc((be), carve_total);                                          \
    carve_dst->block = carve_cur;                                                              \
    (total) = carve_total;                                                                     \
    if (carve_cur) { LIST(CARVE_TAKE) }                                                        \
  } while (0)

/* lt_engine.c: frees the activation block (the session stays usable). */
void lt_engine_acts_free(lt_session_t *s);

/* lt_engine.c: C = alpha A W^T + beta C: BLAS, or the batch-invariant product while sampling
 * decodes (s->rowwise). */
void lt_engine_mm_nt(lt_session_t *s, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *W, int ldw, float beta, float *C, int ldc);

/* lt_engine.c: Y (n, out) = X (n, in) W^T + b + scale * (dropout(X) A^T) B^T, with Y's old
 * content times `beta` added (beta 1 folds a residual connection in). la (n, r) receives
 * dropout(X) A^T; scr NULL means no dropout. */
void lt_engine_linear_fwd(lt_session_t *s, const float *X, int n, int l, int m, float *Y,
                          float beta, float *la, uint64_t dseed, float *scr);

/* lt_engine_sample.c: frees the sampling buffers (the session stays usable). */
void lt_engine_sampl_free(lt_session_t *s);

/* lt_engine_state.c: the checksum of a version-1 state file over its n bytes before the
 * checksum (still read; tests write such files). */
uint64_t lt_engine_state_cks_v1(const void *p, size_t n);

#endif
