/* lt_engine: a Llama-family decoder with LoRA / full-parameter training, AdamW, state files,
 * PEFT export and KV-cache sampling, written against the lt_backend vtable.
 *
 * Read it top to bottom like llm.c's train_gpt2.c: configuration, the parameter table (one
 * list of every weight with its HF name and shape), engine open, session (adapter, gradients,
 * optimizer), activations (one allocation per batch shape, each field with its shape),
 * forward, backward, update, state, export, sampling. */
#include "lt_engine.h"

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_safetensors.h"

#define ROPE_MAX_POS 16384 /* positions the RoPE tables cover at most */

/* ---- RNG: xoshiro256** seeded by SplitMix64 ------------------------------------------------ */

typedef struct rng {
  uint64_t s[4];
} rng_t;

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void rng_seed(rng_t *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng_t *r) {
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
static double rng_uniform(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

static double rng_normal(rng_t *r) {
  double u1 = rng_uniform(r), u2 = rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a ^ rotl(b, 21) ^ rotl(c, 42);
  return splitmix64(&x);
}

/* ---- configuration ------------------------------------------------------------------------- */

static lt_err_t cfg_int(json_t *root, const char *name, const char *key, int required, int dflt,
                        int *out, char *errstr, size_t errstr_size) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) {
    if (required)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: field \"%s\" is missing", name,
                     key);
    *out = dflt;
    return LT_OK;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s: field \"%s\" must be a positive integer", name, key);
  *out = (int)json_integer_value(v);
  return LT_OK;
}

static lt_err_t cfg_num(json_t *root, const char *name, const char *key, double dflt, float *out,
                        char *errstr, size_t errstr_size) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) {
    *out = (float)dflt;
    return LT_OK;
  }
  if (!json_is_number(v) || !(json_number_value(v) > 0))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: field \"%s\" must be a number > 0",
                   name, key);
  *out = (float)json_number_value(v);
  return LT_OK;
}

lt_err_t lt_model_config_parse(const char *text, size_t len, const char *name,
                               lt_model_config_t *out, char *errstr, size_t errstr_size) {
  memset(out, 0, sizeof *out);
  json_error_t jerr;
  json_t *root = json_loadb(text, len, 0, &jerr);
  if (!root)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: not valid JSON: %s (line %d)", name,
                   jerr.text, jerr.line);
  lt_err_t err = LT_OK;
  if (!json_is_object(root)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: expected a JSON object", name);
    goto out;
  }
  json_t *mt = json_object_get(root, "model_type");
  if (mt && !(json_is_string(mt) && (strcmp(json_string_value(mt), "llama") == 0 ||
                                     strcmp(json_string_value(mt), "qwen2") == 0 ||
                                     strcmp(json_string_value(mt), "mistral") == 0))) {
    err = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                  "%s: model_type %s is not supported (expected llama, qwen2 or mistral)", name,
                  json_is_string(mt) ? json_string_value(mt) : "(not a string)");
    goto out;
  }
  json_t *act = json_object_get(root, "hidden_act");
  if (act && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                  "%s: hidden_act must be \"silu\" (SwiGLU)", name);
    goto out;
  }
  if (json_is_true(json_object_get(root, "mlp_bias"))) {
    err = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported",
                  name);
    goto out;
  }
  if ((err = cfg_int(root, name, "vocab_size", 1, 0, &out->vocab_size, errstr, errstr_size)) ||
      (err = cfg_int(root, name, "hidden_size", 1, 0, &out->hidden_size, errstr, errstr_size)) ||
      (err = cfg_int(root, name, "intermediate_size", 1, 0, &out->intermediate_size, errstr,
                     errstr_size)) ||
      (err = cfg_int(root, name, "num_hidden_layers", 1, 0, &out->num_layers, errstr,
                     errstr_size)) ||
      (err = cfg_int(root, name, "num_attention_heads", 1, 0, &out->num_heads, errstr,
                     errstr_size)) ||
      (err = cfg_int(root, name, "num_key_value_heads", 0, out->num_heads, &out->num_kv_heads,
                     errstr, errstr_size)) ||
      (err = cfg_int(root, name, "max_position_embeddings", 0, 2048, &out->max_position, errstr,
                     errstr_size)) ||
      (err = cfg_num(root, name, "rms_norm_eps", 1e-6, &out->rms_norm_eps, errstr,
                     errstr_size)) ||
      (err = cfg_num(root, name, "rope_theta", 10000.0, &out->rope_theta, errstr, errstr_size)))
    goto out;
  if (out->hidden_size % out->num_heads != 0 && !json_object_get(root, "head_dim")) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                  "%s: hidden_size %d is not a multiple of num_attention_heads %d", name,
                  out->hidden_size, out->num_heads);
    goto out;
  }
  if ((err = cfg_int(root, name, "head_dim", 0, out->hidden_size / out->num_heads,
                     &out->head_dim, errstr, errstr_size)))
    goto out;
  if (out->head_dim % 2) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: head_dim %d must be even (RoPE)",
                  name, out->head_dim);
    goto out;
  }
  if (out->num_heads % out->num_kv_heads != 0) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                  "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", name,
                  out->num_heads, out->num_kv_heads);
    goto out;
  }
  json_t *tie = json_object_get(root, "tie_word_embeddings");
  out->tie_embeddings = tie ? json_is_true(tie) : 0;
  out->qkv_bias = json_is_true(json_object_get(root, "attention_bias"));
  out->rope_linear_factor = 1.0f;
  json_t *rs = json_object_get(root, "rope_scaling");
  if (rs && !json_is_null(rs)) {
    json_t *ty = json_object_get(rs, "rope_type");
    if (!ty) ty = json_object_get(rs, "type");
    json_t *fa = json_object_get(rs, "factor");
    if (!json_is_object(rs) || !json_is_string(ty)) {
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                    "%s: rope_scaling must be null or an object with \"type\"", name);
      goto out;
    }
    if (strcmp(json_string_value(ty), "default") == 0) {
      /* same as null */
    } else if (strcmp(json_string_value(ty), "linear") == 0) {
      if (!json_is_number(fa) || !(json_number_value(fa) >= 1.0)) {
        err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                      "%s: rope_scaling.factor must be a number >= 1", name);
        goto out;
      }
      out->rope_linear_factor = (float)json_number_value(fa);
    } else {
      err = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                    "%s: rope_scaling type \"%s\" is not supported (null or \"linear\")", name,
                    json_string_value(ty));
      goto out;
    }
  }
out:
  json_decref(root);
  return err;
}

lt_err_t lt_model_config_write(const lt_model_config_t *c, const char *dir, char *errstr,
                               size_t errstr_size) {
  json_t *o = json_pack(
      "{s:[s],s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:b,s:b,s:s}", "architectures",
      c->qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM", "model_type",
      c->qkv_bias ? "qwen2" : "llama", "hidden_act", "silu", "vocab_size", c->vocab_size,
      "hidden_size", c->hidden_size, "intermediate_size", c->intermediate_size,
      "num_hidden_layers", c->num_layers, "num_attention_heads", c->num_heads,
      "num_key_value_heads", c->num_kv_heads, "head_dim", c->head_dim,
      "max_position_embeddings", c->max_position, "rms_norm_eps", (double)c->rms_norm_eps,
      "rope_theta", (double)c->rope_theta, "tie_word_embeddings", c->tie_embeddings,
      "attention_bias", c->qkv_bias, "torch_dtype", "float32");
  if (!o) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "config.json: out of memory");
  if (c->rope_linear_factor != 1.0f)
    json_object_set_new(o, "rope_scaling", json_pack("{s:s,s:f}", "type", "linear", "factor",
                                                     (double)c->rope_linear_factor));
  else json_object_set_new(o, "rope_scaling", json_null());
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  int rc = json_dump_file(o, path, JSON_INDENT(2) | JSON_SORT_KEYS);
  json_decref(o);
  if (rc != 0) return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot write", path);
  return LT_OK;
}

/* ---- the parameter table ------------------------------------------------------------------ */

enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_COUNT };
static const char *const mod_name[M_COUNT] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};
static const char *const mod_parent[M_COUNT] = {"self_attn", "self_attn", "self_attn",
                                                "self_attn", "mlp",       "mlp",
                                                "mlp"};

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

typedef struct spec {
  char name[96];
  int ndim;
  int64_t shape[2];
  size_t n;
  float **slot;
} spec_t;

static void mod_shape(const lt_model_config_t *c, int m, int *out, int *in) {
  int D = c->hidden_size, F = c->intermediate_size, qd = c->num_heads * c->head_dim,
      kvd = c->num_kv_heads * c->head_dim;
  static const int dummy = 0;
  (void)dummy;
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

static void spec_add(spec_t *s, size_t *n, float **slot, int ndim, int64_t r, int64_t c,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void spec_add(spec_t *s, size_t *n, float **slot, int ndim, int64_t r, int64_t c,
                     const char *fmt, ...) {
  spec_t *e = &s[(*n)++];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->name, sizeof e->name, fmt, ap);
  va_end(ap);
  e->ndim = ndim;
  e->shape[0] = r;
  e->shape[1] = c;
  e->n = (size_t)(r * (ndim == 2 ? c : 1));
  e->slot = slot;
}

static size_t spec_max(const lt_model_config_t *c) { return 3 + (size_t)c->num_layers * 12; }

/* Every weight of the model with its HF name, in file order. w->layer must be allocated. */
static size_t spec_build(const lt_model_config_t *c, weights_t *w, spec_t *s) {
  size_t n = 0;
  int D = c->hidden_size, V = c->vocab_size;
  spec_add(s, &n, &w->embed, 2, V, D, "model.embed_tokens.weight");
  for (int l = 0; l < c->num_layers; l++) {
    layer_w_t *lw = &w->layer[l];
    spec_add(s, &n, &lw->ln1, 1, D, 0, "model.layers.%d.input_layernorm.weight", l);
    for (int m = 0; m < M_COUNT; m++) {
      int o, i;
      mod_shape(c, m, &o, &i);
      spec_add(s, &n, &lw->w[m], 2, o, i, "model.layers.%d.%s.%s.weight", l, mod_parent[m],
               mod_name[m]);
      if (m <= M_V && c->qkv_bias)
        spec_add(s, &n, &lw->b[m], 1, o, 0, "model.layers.%d.%s.%s.bias", l, mod_parent[m],
                 mod_name[m]);
    }
    spec_add(s, &n, &lw->ln2, 1, D, 0, "model.layers.%d.post_attention_layernorm.weight", l);
  }
  spec_add(s, &n, &w->norm, 1, D, 0, "model.norm.weight");
  if (!c->tie_embeddings) spec_add(s, &n, &w->lm_head, 2, V, D, "lm_head.weight");
  return n;
}

/* ---- engine ------------------------------------------------------------------------------ */

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

lt_err_t lt_engine_open(const char *dir, lt_backend_t *be, lt_engine_t **out, char *errstr,
                        size_t errstr_size) {
  *out = NULL;
  lt_err_t err;
  char path[4096], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/config.json", dir);
  if ((err = read_file(path, &text, &len, errstr, errstr_size))) return err;
  lt_engine_t *e = calloc(1, sizeof *e);
  if (!e) {
    free(text);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  }
  e->be = be;
  err = lt_model_config_parse(text, len, path, &e->cfg, errstr, errstr_size);
  free(text);
  if (err) goto fail;
  if ((err = lt_st_open_dir(dir, &e->st, errstr, errstr_size))) goto fail;
  lt_model_config_t *c = &e->cfg;
  /* q/k/v bias present decides (Qwen2 has no config flag for it); o_proj bias is refused */
  char bname[128];
  snprintf(bname, sizeof bname, "model.layers.0.self_attn.q_proj.bias");
  c->qkv_bias = lt_st_find(e->st, bname) != NULL;
  snprintf(bname, sizeof bname, "model.layers.0.self_attn.o_proj.bias");
  if (lt_st_find(e->st, bname)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                  "%s: tensor \"%s\": an o_proj bias is not supported", dir, bname);
    goto fail;
  }
  e->w.layer = calloc((size_t)c->num_layers, sizeof *e->w.layer);
  e->specs = calloc(spec_max(c), sizeof *e->specs);
  e->owned = calloc(spec_max(c), sizeof *e->owned);
  if (!e->w.layer || !e->specs || !e->owned) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
    goto fail;
  }
  size_t ns = spec_build(c, &e->w, e->specs);
  for (size_t i = 0; i < ns; i++) {
    spec_t *s = &e->specs[i];
    const float *data;
    if ((err = lt_st_get_f32(e->st, s->name, s->ndim, s->shape, &data, &e->owned[i], errstr,
                             errstr_size)))
      goto fail;
    const float *dev = be->map_const(be, data, s->n);
    if (!dev) {
      err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: tensor \"%s\": %s", dir, s->name,
                    be->last_error(be));
      goto fail;
    }
    *s->slot = (float *)dev;
    e->nspecs = i + 1;
  }
  if (c->tie_embeddings) e->w.lm_head = e->w.embed;
  /* RoPE tables (HF: inv_freq_j = theta^(-2j/hd), angle = pos / factor * inv_freq_j) */
  int half = c->head_dim / 2;
  e->rope_len = c->max_position < ROPE_MAX_POS ? c->max_position : ROPE_MAX_POS;
  float *hc = malloc((size_t)e->rope_len * half * sizeof(float));
  float *hs = malloc((size_t)e->rope_len * half * sizeof(float));
  e->rope_cos = be->alloc(be, (size_t)e->rope_len * half * sizeof(float));
  e->rope_sin = be->alloc(be, (size_t)e->rope_len * half * sizeof(float));
  if (!hc || !hs || !e->rope_cos || !e->rope_sin) {
    free(hc);
    free(hs);
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "RoPE tables: out of memory");
    goto fail;
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
  *out = e;
  return LT_OK;
fail:
  lt_engine_close(e);
  return err;
}

/* ---- session ----------------------------------------------------------------------------- */

typedef struct lora {
  int on, in, out;
  size_t off_a, off_b; /* offsets in the adapter buffers: A (r, in), B (out, r) */
} lora_t;

/* Activations of one (B, T) shape, one backend allocation (sizes in floats unless int32). */
typedef struct acts {
  int B, T, N;
  int B_cap;      /* rows the block was carved for: a batch of B <= B_cap rows of T reuses it */
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
  float *logits;  /* (N, V), becomes dlogits in the backward pass */
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

long lt_session_step(const lt_session_t *s) { return s->step; }
size_t lt_session_num_params(const lt_session_t *s) { return s->nparams; }

static void acts_free(lt_session_t *s) {
  acts_t *a = &s->a;
  s->be->free(s->be, a->block);
  free(a->h_targets);
  free(a->h_logp);
  free(a->h_coef);
  memset(a, 0, sizeof *a);
}

static void sampl_free(lt_session_t *s) {
  s->be->free(s->be, s->sp.block);
  memset(&s->sp, 0, sizeof s->sp);
}

void lt_session_destroy(lt_session_t *s) {
  if (!s) return;
  acts_free(s);
  sampl_free(s);
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

#define LORA(s, l, m) (&(s)->lora[(size_t)(l) * M_COUNT + (m)])

lt_err_t lt_session_new(lt_engine_t *eng, const lt_session_config_t *cfg, lt_session_t **out,
                        char *errstr, size_t errstr_size) {
  *out = NULL;
  const lt_model_config_t *c = &eng->cfg;
  if (!cfg->full) {
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
  }
  lt_backend_t *be = eng->be;
  lt_session_t *s = calloc(1, sizeof *s);
  if (!s) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  s->eng = eng;
  s->be = be;
  s->cfg = *cfg;
  s->mc = *c;
  rng_seed(&s->rng, cfg->seed);
  lt_err_t err = LT_OK;
  int L = c->num_layers;
  if (cfg->full) {
    s->w.layer = calloc((size_t)L, sizeof *s->w.layer);
    s->gw.layer = calloc((size_t)L, sizeof *s->gw.layer);
    s->specs = calloc(spec_max(c), sizeof *s->specs);
    s->gspecs = calloc(spec_max(c), sizeof *s->gspecs);
    if (!s->w.layer || !s->gw.layer || !s->specs || !s->gspecs) goto oom;
    s->nspecs = spec_build(c, &s->w, s->specs);
    spec_build(c, &s->gw, s->gspecs);
    for (size_t i = 0; i < s->nspecs; i++) s->nparams += s->specs[i].n;
  } else {
    s->w = eng->w; /* shares the engine's layer array: read-only */
    s->w.layer = calloc((size_t)L, sizeof *s->w.layer);
    s->lora = calloc((size_t)L * M_COUNT, sizeof *s->lora);
    if (!s->w.layer || !s->lora) goto oom;
    memcpy(s->w.layer, eng->w.layer, (size_t)L * sizeof *s->w.layer);
    s->lora_scale = cfg->alpha / (float)cfg->rank;
    for (int l = 0; l < L; l++)
      for (int m = 0; m < M_COUNT; m++) {
        lora_t *lo = LORA(s, l, m);
        if (!(cfg->targets & (1u << m))) continue;
        lo->on = 1;
        mod_shape(c, m, &lo->out, &lo->in);
        lo->off_a = s->nparams;
        s->nparams += (size_t)cfg->rank * lo->in;
        lo->off_b = s->nparams;
        s->nparams += (size_t)lo->out * cfg->rank;
      }
  }
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
  if (cfg->full) {
    size_t off = 0;
    for (size_t i = 0; i < s->nspecs; i++) {
      *s->specs[i].slot = s->params + off;
      *s->gspecs[i].slot = s->grads + off;
      be->copy(be, s->params + off, *eng->specs[i].slot, s->specs[i].n);
      off += s->specs[i].n;
    }
    if (c->tie_embeddings) {
      s->w.lm_head = s->w.embed;
      s->gw.lm_head = s->gw.embed;
    }
  } else {
    /* A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT: kaiming_uniform_(a=sqrt(5))), B = 0 */
    float *host = malloc(bytes ? bytes : 1);
    if (!host) goto oom;
    memset(host, 0, bytes);
    for (int l = 0; l < L; l++)
      for (int m = 0; m < M_COUNT; m++) {
        lora_t *lo = LORA(s, l, m);
        if (!lo->on) continue;
        double bound = 1.0 / sqrt((double)lo->in);
        for (size_t i = 0; i < (size_t)cfg->rank * lo->in; i++)
          host[lo->off_a + i] = (float)((2.0 * rng_uniform(&s->rng) - 1.0) * bound);
      }
    be->upload(be, s->params, host, bytes);
    free(host);
  }
  *out = s;
  return LT_OK;
oom:
  err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "session: out of memory");
fail:
  lt_session_destroy(s);
  return err;
}

/* ---- activations ------------------------------------------------------------------------- */

static lt_err_t acts_ensure(lt_session_t *s, int B, int T, char *errstr, size_t errstr_size) {
  acts_t *a = &s->a;
  if (a->block && a->T == T && B <= a->B_cap) {
    /* Fewer rows of the same length (a packed batch): every piece is indexed by a->N, so a
     * prefix of the block serves; nothing is allocated per step. */
    a->B = B;
    a->N = B * T;
    a->state_floats = s->be->attn_state_floats(s->be, B, T, s->mc.num_heads);
    return LT_OK;
  }
  acts_free(s);
  const lt_model_config_t *c = &s->mc;
  lt_backend_t *be = s->be;
  size_t N = (size_t)B * T, L = (size_t)c->num_layers, D = (size_t)c->hidden_size,
         F = (size_t)c->intermediate_size, QD = (size_t)c->num_heads * c->head_dim,
         KD = (size_t)c->num_kv_heads * c->head_dim, V = (size_t)c->vocab_size,
         r = s->cfg.full ? 0 : (size_t)s->cfg.rank;
  size_t st = be->attn_state_floats(be, B, T, c->num_heads);
  size_t wide = D > F ? D : F;
  wide = wide > QD ? wide : QD;
  size_t dlnw = D > QD ? D : QD;
  /* carve one block; each piece rounded to 16 floats (64 bytes) */
#define PIECES(X)                                                                              \
  X(tokens, N, int32_t) X(targets, N, int32_t) X(pos, N, int32_t) X(resid, (L + 1) * N * D, float) \
  X(ln1, L * N * D, float) X(rstd1, L * N, float) X(q, L * N * QD, float)                     \
  X(k, L * N * KD, float) X(v, L * N * KD, float) X(att, L * st, float)                        \
  X(atty, L * N * QD, float) X(xmid, L * N * D, float) X(ln2, L * N * D, float)                \
  X(rstd2, L * N, float) X(g, L * N * F, float) X(u, L * N * F, float) X(h, L * N * F, float)  \
  X(la, L * M_COUNT * N * r, float) X(lnf, N * D, float) X(rstdf, N, float)                    \
  X(logits, N * V, float) X(lse, N, float) X(logp, N, float) X(coef, N, float)                 \
  X(dx, N * D, float) X(dln, N * dlnw, float) X(dq, N * QD, float) X(datty, N * QD, float)     \
  X(dk, N * KD, float) X(dv, N * KD, float) X(dg, N * F, float) X(du, N * F, float)            \
  X(dh, N * F, float) X(dla, N * (r ? r : 1), float) X(scr, N * wide, float)
  size_t total = 0;
#define COUNT(name, n, T_) total += (((n) * sizeof(T_)) + 63) & ~(size_t)63;
  PIECES(COUNT)
  char *p = be->alloc(be, total);
  if (!p)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM,
                   "activations for batch %d x %d tokens (%.1f MiB): %s", B, T,
                   (double)total / (1 << 20), be->last_error(be));
  a->block = p;
#define CARVE(name, n, T_)                                                                     \
  a->name = (T_ *)(void *)p;                                                                   \
  p += (((n) * sizeof(T_)) + 63) & ~(size_t)63;
  PIECES(CARVE)
#undef PIECES
#undef COUNT
#undef CARVE
  a->B = B;
  a->B_cap = B;
  a->T = T;
  a->N = (int)N;
  a->state_floats = st;
  a->h_targets = malloc(N * sizeof(int32_t));
  a->h_logp = malloc(N * sizeof(float));
  a->h_coef = malloc(N * sizeof(float));
  if (!a->h_targets || !a->h_logp || !a->h_coef) {
    acts_free(s);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "activations: out of memory");
  }
  int32_t *pos = malloc(N * sizeof(int32_t));
  if (!pos) {
    acts_free(s);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "activations: out of memory");
  }
  for (size_t i = 0; i < N; i++) pos[i] = (int32_t)(i % (size_t)T);
  be->upload(be, a->pos, pos, N * sizeof(int32_t));
  free(pos);
  return LT_OK;
}

/* ---- linear layers (base + bias + LoRA) ---------------------------------------------------- */

/* C = alpha A W^T + beta C: BLAS, or the batch-invariant product while sampling decodes. */
static void mm_nt(lt_session_t *s, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *W, int ldw, float beta, float *C, int ldc) {
  if (s->rowwise) s->be->matmul_rows(s->be, M, N, K, alpha, A, lda, W, ldw, beta, C, ldc);
  else s->be->matmul(s->be, 0, 1, M, N, K, alpha, A, lda, W, ldw, beta, C, ldc);
}

/* Y (n, out) = X (n, in) W^T + b + scale * (dropout(X) A^T) B^T, with Y's old content times
 * `beta` added (beta 1 folds a residual connection in). la (n, r) receives dropout(X) A^T. */
static void linear_fwd(lt_session_t *s, const float *X, int n, int l, int m, float *Y,
                       float beta, float *la, uint64_t dseed, float *scr) {
  lt_backend_t *be = s->be;
  int out, in;
  mod_shape(&s->mc, m, &out, &in);
  const layer_w_t *lw = &s->w.layer[l];
  mm_nt(s, n, out, in, 1.0f, X, in, lw->w[m], in, beta, Y, out);
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
  mm_nt(s, n, r, in, 1.0f, Xd, in, s->params + lo->off_a, in, 0.0f, la, r);
  mm_nt(s, n, out, r, s->lora_scale, la, r, s->params + lo->off_b, r, 1.0f, Y, out);
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

/* Forward pass over the uploaded tokens of shape (B, T) up to the logits. */
static void forward(lt_session_t *s, int train) {
  lt_backend_t *be = s->be;
  acts_t *a = &s->a;
  const lt_model_config_t *c = &s->mc;
  const lt_engine_t *e = s->eng;
  int N = a->N, D = c->hidden_size, F = c->intermediate_size, H = c->num_heads,
      KV = c->num_kv_heads, hd = c->head_dim, QD = H * hd, KD = KV * hd;
  size_t r = s->cfg.full ? 0 : (size_t)s->cfg.rank;
  float *scr = train && s->cfg.dropout > 0 ? a->scr : NULL;
  be->embed_fwd(be, a->resid, s->w.embed, a->tokens, N, D);
  for (int l = 0; l < c->num_layers; l++) {
    const layer_w_t *lw = &s->w.layer[l];
    float *x = a->resid + (size_t)l * N * D, *xo = x + (size_t)N * D;
    float *ln1 = a->ln1 + (size_t)l * N * D, *rstd1 = a->rstd1 + (size_t)l * N;
    float *q = a->q + (size_t)l * N * QD, *k = a->k + (size_t)l * N * KD,
          *v = a->v + (size_t)l * N * KD;
    float *att = a->att + (size_t)l * a->state_floats, *atty = a->atty + (size_t)l * N * QD;
    float *xmid = a->xmid + (size_t)l * N * D, *ln2 = a->ln2 + (size_t)l * N * D,
          *rstd2 = a->rstd2 + (size_t)l * N;
    float *g = a->g + (size_t)l * N * F, *u = a->u + (size_t)l * N * F,
          *h = a->h + (size_t)l * N * F;
    float *la = a->la + (size_t)l * M_COUNT * N * r;
#define LA(m) (la + (size_t)(m) * N * r)
    be->rmsnorm_fwd(be, ln1, rstd1, x, lw->ln1, N, D, c->rms_norm_eps);
    linear_fwd(s, ln1, N, l, M_Q, q, 0.0f, LA(M_Q), drop_seed(s, l, M_Q), scr);
    linear_fwd(s, ln1, N, l, M_K, k, 0.0f, LA(M_K), drop_seed(s, l, M_K), scr);
    linear_fwd(s, ln1, N, l, M_V, v, 0.0f, LA(M_V), drop_seed(s, l, M_V), scr);
    be->rope(be, q, e->rope_cos, e->rope_sin, a->pos, N, H, hd, 0);
    be->rope(be, k, e->rope_cos, e->rope_sin, a->pos, N, KV, hd, 0);
    be->attn_fwd(be, atty, att, q, k, v, a->pos, a->B, a->T, H, KV, hd);
    be->copy(be, xmid, x, (size_t)N * D);
    linear_fwd(s, atty, N, l, M_O, xmid, 1.0f, LA(M_O), drop_seed(s, l, M_O), scr);
    be->rmsnorm_fwd(be, ln2, rstd2, xmid, lw->ln2, N, D, c->rms_norm_eps);
    linear_fwd(s, ln2, N, l, M_GATE, g, 0.0f, LA(M_GATE), drop_seed(s, l, M_GATE), scr);
    linear_fwd(s, ln2, N, l, M_UP, u, 0.0f, LA(M_UP), drop_seed(s, l, M_UP), scr);
    be->swiglu_fwd(be, h, g, u, (size_t)N * F);
    be->copy(be, xo, xmid, (size_t)N * D);
    linear_fwd(s, h, N, l, M_DOWN, xo, 1.0f, LA(M_DOWN), drop_seed(s, l, M_DOWN), scr);
  }
  be->rmsnorm_fwd(be, a->lnf, a->rstdf, a->resid + (size_t)c->num_layers * N * D, s->w.norm, N,
                  D, c->rms_norm_eps);
  be->matmul(be, 0, 1, N, c->vocab_size, D, 1.0f, a->lnf, D, s->w.lm_head, D, 0.0f, a->logits,
             c->vocab_size);
}

/* ---- backward ---------------------------------------------------------------------------- */

/* Backward pass from the logit gradients (already in a->logits) to every trainable weight. */
static void backward(lt_session_t *s) {
  lt_backend_t *be = s->be;
  acts_t *a = &s->a;
  const lt_model_config_t *c = &s->mc;
  const lt_engine_t *e = s->eng;
  int N = a->N, D = c->hidden_size, F = c->intermediate_size, H = c->num_heads,
      KV = c->num_kv_heads, hd = c->head_dim, QD = H * hd, KD = KV * hd, V = c->vocab_size,
      L = c->num_layers, full = s->cfg.full;
  size_t r = full ? 0 : (size_t)s->cfg.rank;
  be->matmul(be, 0, 0, N, D, V, 1.0f, a->logits, V, s->w.lm_head, D, 0.0f, a->dln, D);
  if (full) be->matmul(be, 1, 0, V, D, N, 1.0f, a->logits, V, a->lnf, D, 1.0f, s->gw.lm_head, D);
  be->zero(be, a->dx, (size_t)N * D);
  be->rmsnorm_bwd(be, a->dx, full ? s->gw.norm : NULL, a->dln, a->resid + (size_t)L * N * D,
                  s->w.norm, a->rstdf, N, D);
  for (int l = L - 1; l >= 0; l--) {
    const layer_w_t *lw = &s->w.layer[l];
    layer_w_t *gl = full ? &s->gw.layer[l] : NULL;
    float *x = a->resid + (size_t)l * N * D;
    float *ln1 = a->ln1 + (size_t)l * N * D, *rstd1 = a->rstd1 + (size_t)l * N;
    float *q = a->q + (size_t)l * N * QD, *k = a->k + (size_t)l * N * KD,
          *v = a->v + (size_t)l * N * KD;
    float *att = a->att + (size_t)l * a->state_floats, *atty = a->atty + (size_t)l * N * QD;
    float *xmid = a->xmid + (size_t)l * N * D, *ln2 = a->ln2 + (size_t)l * N * D,
          *rstd2 = a->rstd2 + (size_t)l * N;
    float *g = a->g + (size_t)l * N * F, *u = a->u + (size_t)l * N * F,
          *h = a->h + (size_t)l * N * F;
    float *la = a->la + (size_t)l * M_COUNT * N * r;
    /* MLP: resid[l+1] = xmid + down(silu(gate(ln2)) * up(ln2)) */
    linear_bwd(s, a->dx, h, N, l, M_DOWN, a->dh, 0.0f, LA(M_DOWN), drop_seed(s, l, M_DOWN));
    be->swiglu_bwd(be, a->dg, a->du, a->dh, g, u, (size_t)N * F);
    linear_bwd(s, a->dg, ln2, N, l, M_GATE, a->dln, 0.0f, LA(M_GATE), drop_seed(s, l, M_GATE));
    linear_bwd(s, a->du, ln2, N, l, M_UP, a->dln, 1.0f, LA(M_UP), drop_seed(s, l, M_UP));
    be->rmsnorm_bwd(be, a->dx, gl ? gl->ln2 : NULL, a->dln, xmid, lw->ln2, rstd2, N, D);
    /* attention: xmid = x + o(attn(rope(q(ln1)), rope(k(ln1)), v(ln1))) */
    linear_bwd(s, a->dx, atty, N, l, M_O, a->datty, 0.0f, LA(M_O), drop_seed(s, l, M_O));
    be->attn_bwd(be, a->dq, a->dk, a->dv, a->datty, q, k, v, atty, att, a->pos, a->B, a->T, H,
                 KV, hd);
    be->rope(be, a->dq, e->rope_cos, e->rope_sin, a->pos, N, H, hd, 1);
    be->rope(be, a->dk, e->rope_cos, e->rope_sin, a->pos, N, KV, hd, 1);
    linear_bwd(s, a->dq, ln1, N, l, M_Q, a->dln, 0.0f, LA(M_Q), drop_seed(s, l, M_Q));
    linear_bwd(s, a->dk, ln1, N, l, M_K, a->dln, 1.0f, LA(M_K), drop_seed(s, l, M_K));
    linear_bwd(s, a->dv, ln1, N, l, M_V, a->dln, 1.0f, LA(M_V), drop_seed(s, l, M_V));
    be->rmsnorm_bwd(be, a->dx, gl ? gl->ln1 : NULL, a->dln, x, lw->ln1, rstd1, N, D);
  }
  if (full) be->embed_bwd(be, s->gw.embed, a->dx, a->tokens, N, D);
#undef LA
}

/* ---- the primitives ---------------------------------------------------------------------- */

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
  if (loss == LT_LOSS_IMPORTANCE && (!b->advantages || !b->sampler_logp))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "batch: the importance-sampling loss needs advantages and sampler_logp");
  if (loss != LT_LOSS_CROSS_ENTROPY && loss != LT_LOSS_IMPORTANCE)
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
    if (w != 0 && loss == LT_LOSS_IMPORTANCE &&
        (!isfinite(b->advantages[i]) || !isfinite(b->sampler_logp[i])))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "batch: advantages/sampler_logp[%zu][%zu] is not finite", i / (size_t)b->T,
                     i % (size_t)b->T);
    W += w;
  }
  if (!(W > 0))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "batch: every token has weight 0, there is nothing to learn from");
  return LT_OK;
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

/* Forward (+ backward when train) of a batch with a loss. */
static lt_err_t run_batch(lt_session_t *s, const lt_batch_t *b, lt_loss_t loss, int train,
                          float *loss_out, float *logp_out, char *errstr, size_t errstr_size) {
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
  be->ce_fwd(be, a->logp, a->lse, a->logits, a->targets, (int)N, s->mc.vocab_size);
  be->download(be, a->h_logp, a->logp, N * sizeof(float));
  /* loss and its derivative wrt each log-prob, on the host in double, fixed order */
  double W = 0, Ls = 0;
  for (size_t i = 0; i < N; i++) W += b->weights ? b->weights[i] : 1.0f;
  for (size_t i = 0; i < N; i++) {
    double w = b->weights ? b->weights[i] : 1.0f, lp = a->h_logp[i];
    if (w == 0) {
      a->h_coef[i] = 0;
      continue;
    }
    if (loss == LT_LOSS_CROSS_ENTROPY) {
      Ls += -w * lp;
      a->h_coef[i] = (float)(-w / W);
    } else {
      double ratio = exp(lp - (double)b->sampler_logp[i]), adv = b->advantages[i];
      Ls += -w * ratio * adv;
      a->h_coef[i] = (float)(-w * ratio * adv / W);
    }
  }
  if (loss_out) *loss_out = (float)(Ls / W);
  if (logp_out) memcpy(logp_out, a->h_logp, N * sizeof(float));
  if (!train) return LT_OK;
  be->upload(be, a->coef, a->h_coef, N * sizeof(float));
  be->ce_bwd(be, a->logits, a->lse, a->targets, a->coef, (int)N, s->mc.vocab_size);
  backward(s);
  s->accum++;
  s->fb_calls++;
  return LT_OK;
}

lt_err_t lt_forward_backward(lt_session_t *s, const lt_batch_t *b, lt_loss_t loss,
                             float *loss_out, float *logp_out, char *errstr,
                             size_t errstr_size) {
  return run_batch(s, b, loss, 1, loss_out, logp_out, errstr, errstr_size);
}

lt_err_t lt_forward(lt_session_t *s, const lt_batch_t *b, lt_loss_t loss, float *loss_out,
                    float *logp_out, char *errstr, size_t errstr_size) {
  return run_batch(s, b, loss, 0, loss_out, logp_out, errstr, errstr_size);
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
  return s->be->download(s->be, logits_out, s->a.logits,
                         (size_t)B * T * s->mc.vocab_size * sizeof(float));
}

lt_err_t lt_optim_step(lt_session_t *s, const lt_adamw_t *o, float *grad_norm_out, char *errstr,
                       size_t errstr_size) {
  if (s->accum == 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "optim_step: no forward_backward since the last step, no gradient to apply");
  if (!(o->lr >= 0) || !(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) ||
      !(o->eps > 0) || !(o->weight_decay >= 0))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "optim_step: expected lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0");
  lt_backend_t *be = s->be;
  double inv = 1.0 / (double)s->accum;
  double norm = sqrt(be->sumsq(be, s->grads, s->nparams)) * inv;
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

/* ---- state files ------------------------------------------------------------------------- */

#define STATE_MAGIC "LTSTATE\0"
#define STATE_VERSION 1u

/* Header fields after the 8-byte magic, all little-endian 64-bit. */
enum {
  H_VERSION, H_FULL, H_RANK, H_TARGETS, H_ALPHA_BITS, H_DROPOUT_BITS, H_L, H_D, H_F, H_H, H_KV,
  H_V, H_HD, H_QKV_BIAS, H_TIE, H_SEED, H_STEP, H_FB_CALLS, H_CURSOR, H_RNG0, H_RNG1, H_RNG2,
  H_RNG3, H_NPARAMS, H_COUNT
};

static const char *const hdr_name[H_COUNT] = {
    "version", "full", "rank", "targets", "alpha", "dropout", "num_layers", "hidden_size",
    "intermediate_size", "num_heads", "num_kv_heads", "vocab_size", "head_dim", "qkv_bias",
    "tie_embeddings", "seed", "step", "fb_calls", "cursor", "rng", "rng", "rng", "rng",
    "nparams"};

/* 64-bit checksum over bytes, processed in 8-byte little-endian words (tail zero-padded). */
typedef struct cks {
  uint64_t h;
  unsigned char buf[8];
  size_t nbuf;
  uint64_t len;
} cks_t;

static void cks_word(cks_t *c, uint64_t w) {
  c->h ^= w * 0x9E3779B97F4A7C15ull;
  c->h = rotl(c->h, 27) * 0xC2B2AE3D27D4EB4Full + 0x165667B19E3779F9ull;
}
static void cks_add(cks_t *c, const void *p, size_t n) {
  const unsigned char *b = p;
  c->len += n;
  while (n) {
    if (c->nbuf == 0 && n >= 8) {
      uint64_t w;
      memcpy(&w, b, 8);
      cks_word(c, w);
      b += 8;
      n -= 8;
      continue;
    }
    c->buf[c->nbuf++] = *b++;
    n--;
    if (c->nbuf == 8) {
      uint64_t w;
      memcpy(&w, c->buf, 8);
      cks_word(c, w);
      c->nbuf = 0;
    }
  }
}
static uint64_t cks_final(cks_t *c) {
  if (c->nbuf) {
    memset(c->buf + c->nbuf, 0, 8 - c->nbuf);
    uint64_t w;
    memcpy(&w, c->buf, 8);
    cks_word(c, w);
  }
  cks_word(c, c->len);
  return c->h ^ (c->h >> 29);
}

static uint64_t f2bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void state_header(const lt_session_t *s, uint64_t cursor, uint64_t *h) {
  const lt_model_config_t *c = &s->mc;
  h[H_VERSION] = STATE_VERSION;
  h[H_FULL] = (uint64_t)s->cfg.full;
  h[H_RANK] = s->cfg.full ? 0 : (uint64_t)s->cfg.rank;
  h[H_TARGETS] = s->cfg.full ? 0 : s->cfg.targets;
  h[H_ALPHA_BITS] = s->cfg.full ? 0 : f2bits(s->cfg.alpha);
  h[H_DROPOUT_BITS] = s->cfg.full ? 0 : f2bits(s->cfg.dropout);
  h[H_L] = (uint64_t)c->num_layers;
  h[H_D] = (uint64_t)c->hidden_size;
  h[H_F] = (uint64_t)c->intermediate_size;
  h[H_H] = (uint64_t)c->num_heads;
  h[H_KV] = (uint64_t)c->num_kv_heads;
  h[H_V] = (uint64_t)c->vocab_size;
  h[H_HD] = (uint64_t)c->head_dim;
  h[H_QKV_BIAS] = (uint64_t)c->qkv_bias;
  h[H_TIE] = (uint64_t)c->tie_embeddings;
  h[H_SEED] = s->cfg.seed;
  h[H_STEP] = (uint64_t)s->step;
  h[H_FB_CALLS] = s->fb_calls;
  h[H_CURSOR] = cursor;
  for (int i = 0; i < 4; i++) h[H_RNG0 + i] = s->rng.s[i];
  h[H_NPARAMS] = s->nparams;
}

lt_err_t lt_save_state(lt_session_t *s, const char *path, uint64_t cursor, char *errstr,
                       size_t errstr_size) {
  lt_backend_t *be = s->be;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *fp = fopen(tmp, "wb");
  if (!fp)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot create: %s", tmp,
                   strerror(errno));
  uint64_t h[H_COUNT];
  state_header(s, cursor, h);
  unsigned char hb[8 * H_COUNT];
  for (int i = 0; i < H_COUNT; i++)
    for (int j = 0; j < 8; j++) hb[8 * i + j] = (unsigned char)(h[i] >> (8 * j));
  cks_t ck = {0};
  int ok = fwrite(STATE_MAGIC, 1, 8, fp) == 8 && fwrite(hb, 1, sizeof hb, fp) == sizeof hb;
  cks_add(&ck, STATE_MAGIC, 8);
  cks_add(&ck, hb, sizeof hb);
  /* payload: params, m, v, streamed through a host buffer */
  size_t chunk_n = 1 << 20;
  float *buf = malloc(chunk_n * sizeof(float));
  if (!buf) ok = 0;
  float *bufs[3] = {s->params, s->m, s->v};
  for (int k = 0; ok && k < 3; k++)
    for (size_t off = 0; ok && off < s->nparams; off += chunk_n) {
      size_t n = s->nparams - off < chunk_n ? s->nparams - off : chunk_n;
      if (be->download(be, buf, bufs[k] + off, n * sizeof(float)) != LT_OK) ok = 0;
      cks_add(&ck, buf, n * sizeof(float));
      if (ok && fwrite(buf, sizeof(float), n, fp) != n) ok = 0;
    }
  free(buf);
  uint64_t sum = cks_final(&ck);
  unsigned char sb[8];
  for (int j = 0; j < 8; j++) sb[j] = (unsigned char)(sum >> (8 * j));
  if (ok && fwrite(sb, 1, 8, fp) != 8) ok = 0;
  if (ok && (fflush(fp) != 0 || fsync(fileno(fp)) != 0)) ok = 0;
  if (fclose(fp) != 0) ok = 0;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: write failed: %s", path,
                   strerror(errno));
  }
  return LT_OK;
}

lt_err_t lt_load_state(lt_session_t *s, const char *path, uint64_t *cursor, char *errstr,
                       size_t errstr_size) {
  lt_err_t err = LT_OK;
  float *host = NULL;
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return lt_errf(errstr, errstr_size, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO,
                   "%s: cannot open: %s", path, strerror(errno));
  char magic[8];
  unsigned char hb[8 * H_COUNT];
  if (fread(magic, 1, 8, fp) != 8 || memcmp(magic, STATE_MAGIC, 8) != 0) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                  "%s: not a Lathe training state (magic \"LTSTATE\" missing)", path);
    goto out;
  }
  if (fread(hb, 1, 8, fp) != 8) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: truncated header", path);
    goto out;
  }
  uint64_t ver = 0;
  for (int j = 7; j >= 0; j--) ver = (ver << 8) | hb[j];
  if (ver != STATE_VERSION) {
    err = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                  "%s: state format version %llu, this build reads version %u", path,
                  (unsigned long long)ver, STATE_VERSION);
    goto out;
  }
  if (fread(hb + 8, 1, sizeof hb - 8, fp) != sizeof hb - 8) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: truncated header", path);
    goto out;
  }
  uint64_t h[H_COUNT], want[H_COUNT];
  for (int i = 0; i < H_COUNT; i++) {
    h[i] = 0;
    for (int j = 7; j >= 0; j--) h[i] = (h[i] << 8) | hb[8 * i + j];
  }
  state_header(s, 0, want);
  /* shape of model and adapter must match; seed/step/cursor/rng are restored */
  for (int i = H_FULL; i <= H_TIE; i++)
    if (h[i] != want[i]) {
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                    "%s: saved for a different model or adapter: %s is %llu here, %llu in the "
                    "file",
                    path, hdr_name[i], (unsigned long long)want[i], (unsigned long long)h[i]);
      goto out;
    }
  if (h[H_NPARAMS] != s->nparams) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: %llu parameters, expected %zu", path,
                  (unsigned long long)h[H_NPARAMS], s->nparams);
    goto out;
  }
  size_t n = s->nparams;
  host = malloc(3 * n * sizeof(float) + 1);
  if (!host) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: out of memory", path);
    goto out;
  }
  unsigned char sb[8];
  if (fread(host, sizeof(float), 3 * n, fp) != 3 * n || fread(sb, 1, 8, fp) != 8) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                  "%s: truncated: expected %zu bytes of parameters and moments", path,
                  3 * n * sizeof(float) + 8);
    goto out;
  }
  if (fgetc(fp) != EOF) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: trailing bytes after the checksum",
                  path);
    goto out;
  }
  cks_t ck = {0};
  cks_add(&ck, magic, 8);
  cks_add(&ck, hb, sizeof hb);
  cks_add(&ck, host, 3 * n * sizeof(float));
  uint64_t sum = 0;
  for (int j = 7; j >= 0; j--) sum = (sum << 8) | sb[j];
  if (cks_final(&ck) != sum) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                  "%s: checksum mismatch: the file is damaged", path);
    goto out;
  }
  lt_backend_t *be = s->be;
  be->upload(be, s->params, host, n * sizeof(float));
  be->upload(be, s->m, host + n, n * sizeof(float));
  be->upload(be, s->v, host + 2 * n, n * sizeof(float));
  be->zero(be, s->grads, n);
  s->accum = 0;
  s->cfg.seed = h[H_SEED];
  s->step = (long)h[H_STEP];
  s->fb_calls = h[H_FB_CALLS];
  for (int i = 0; i < 4; i++) s->rng.s[i] = h[H_RNG0 + i];
  if (cursor) *cursor = h[H_CURSOR];
out:
  if (host) {
    memset(host, 0, 3 * s->nparams * sizeof(float));
    free(host);
  }
  fclose(fp);
  return err;
}

/* ---- export ------------------------------------------------------------------------------ */

static lt_err_t ensure_dir(const char *dir, char *errstr, size_t errstr_size) {
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot create directory: %s", dir,
                   strerror(errno));
  return LT_OK;
}

/* Names and shapes of the trainable tensors over a host copy of a flat buffer. Returns the
 * count; ent and names hold room for the maximum. */
static size_t trainable_entries(const lt_session_t *s, const float *host, lt_st_entry_t *ent,
                                char (*names)[128]) {
  size_t n = 0;
  if (s->cfg.full) {
    size_t off = 0;
    for (size_t i = 0; i < s->nspecs; i++) {
      snprintf(names[n], sizeof names[n], "%s", s->specs[i].name);
      ent[n] = (lt_st_entry_t){.name = names[n], .dtype = LT_ST_F32, .ndim = s->specs[i].ndim,
                               .data = host + off};
      ent[n].shape[0] = s->specs[i].shape[0];
      ent[n].shape[1] = s->specs[i].shape[1];
      off += s->specs[i].n;
      n++;
    }
    return n;
  }
  int r = s->cfg.rank;
  for (int l = 0; l < s->mc.num_layers; l++)
    for (int m = 0; m < M_COUNT; m++) {
      const lora_t *lo = LORA(s, l, m);
      if (!lo->on) continue;
      for (int ab = 0; ab < 2; ab++) {
        snprintf(names[n], sizeof names[n],
                 "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l, mod_parent[m],
                 mod_name[m], ab ? 'B' : 'A');
        ent[n] = (lt_st_entry_t){.name = names[n], .dtype = LT_ST_F32, .ndim = 2};
        ent[n].shape[0] = ab ? lo->out : r;
        ent[n].shape[1] = ab ? r : lo->in;
        ent[n].data = host + (ab ? lo->off_b : lo->off_a);
        n++;
      }
    }
  return n;
}

static size_t trainable_max(const lt_session_t *s) {
  return s->cfg.full ? s->nspecs : (size_t)s->mc.num_layers * M_COUNT * 2;
}

lt_err_t lt_dump_tensors(lt_session_t *s, int which, const char *path, char *errstr,
                         size_t errstr_size) {
  lt_err_t err = LT_OK;
  float *host = malloc(s->nparams * sizeof(float) + 1);
  lt_st_entry_t *ent = calloc(trainable_max(s), sizeof *ent);
  char(*names)[128] = calloc(trainable_max(s), sizeof *names);
  if (!host || !ent || !names) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "dump: out of memory");
    goto out;
  }
  s->be->download(s->be, host, which ? s->grads : s->params, s->nparams * sizeof(float));
  size_t n = trainable_entries(s, host, ent, names);
  err = lt_st_write(path, ent, n, errstr, errstr_size);
out:
  free(host);
  free(ent);
  free(names);
  return err;
}

lt_err_t lt_export_peft(lt_session_t *s, const char *dir, const char *base_model_name,
                        char *errstr, size_t errstr_size) {
  if (s->cfg.full)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "export_peft: a full-parameter session has no adapter (use export_model)");
  lt_err_t err;
  if ((err = ensure_dir(dir, errstr, errstr_size))) return err;
  int r = s->cfg.rank;
  float *host = malloc(s->nparams * sizeof(float) + 1);
  lt_st_entry_t *ent = calloc(trainable_max(s), sizeof *ent);
  char(*names)[128] = calloc(trainable_max(s), sizeof *names);
  json_t *cfg = NULL;
  if (!host || !ent || !names) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "export_peft: out of memory");
    goto out;
  }
  s->be->download(s->be, host, s->params, s->nparams * sizeof(float));
  size_t n = trainable_entries(s, host, ent, names);
  char path[4096];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  if ((err = lt_st_write(path, ent, n, errstr, errstr_size))) goto out;
  json_t *tm = json_array();
  for (int m = 0; m < M_COUNT; m++)
    if (s->cfg.targets & (1u << m)) json_array_append_new(tm, json_string(mod_name[m]));
  cfg = json_pack("{s:s,s:s,s:i,s:f,s:f,s:o,s:s,s:s,s:b,s:b,s:n,s:n,s:b}", "peft_type", "LORA",
                  "task_type", "CAUSAL_LM", "r", r, "lora_alpha", (double)s->cfg.alpha,
                  "lora_dropout", (double)s->cfg.dropout, "target_modules", tm, "bias", "none",
                  "base_model_name_or_path", base_model_name ? base_model_name : "",
                  "fan_in_fan_out", 0, "inference_mode", 1, "modules_to_save",
                  "layers_to_transform", "use_rslora", 0);
  if (!cfg) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "export_peft: out of memory");
    goto out;
  }
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  if (json_dump_file(cfg, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
    err = lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot write", path);
out:
  if (host) {
    memset(host, 0, s->nparams * sizeof(float));
    free(host);
  }
  free(ent);
  free(names);
  json_decref(cfg);
  return err;
}

lt_err_t lt_export_model(lt_session_t *s, const char *dir, char *errstr, size_t errstr_size) {
  lt_err_t err;
  if ((err = ensure_dir(dir, errstr, errstr_size))) return err;
  const lt_model_config_t *c = &s->mc;
  lt_engine_t *e = s->eng;
  size_t ns = e->nspecs, total = 0;
  for (size_t i = 0; i < ns; i++) total += e->specs[i].n;
  float *host = malloc(total * sizeof(float) + 1);
  float *ad = s->cfg.full ? NULL : malloc(s->nparams * sizeof(float) + 1);
  lt_st_entry_t *ent = calloc(ns, sizeof *ent);
  if (!host || !ent || (!s->cfg.full && !ad)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "export_model: out of memory");
    goto out;
  }
  /* the session's weights (full) or the engine's; both tables list tensors in the same order */
  const spec_t *sp = s->cfg.full ? s->specs : e->specs;
  if (ad) s->be->download(s->be, ad, s->params, s->nparams * sizeof(float));
  size_t off = 0;
  for (size_t i = 0; i < ns; i++) {
    float *dst = host + off;
    s->be->download(s->be, dst, *sp[i].slot, sp[i].n * sizeof(float));
    ent[i] = (lt_st_entry_t){.name = e->specs[i].name, .dtype = LT_ST_F32,
                             .ndim = e->specs[i].ndim, .data = dst};
    ent[i].shape[0] = e->specs[i].shape[0];
    ent[i].shape[1] = e->specs[i].shape[1];
    off += sp[i].n;
  }
  if (ad) { /* merge: W += alpha/r * B A */
    int r = s->cfg.rank;
    for (size_t i = 0; i < ns; i++)
      for (int l = 0; l < c->num_layers; l++)
        for (int m = 0; m < M_COUNT; m++) {
          const lora_t *lo = LORA(s, l, m);
          if (!lo->on || e->specs[i].slot != &e->w.layer[l].w[m]) continue;
          float *W = (float *)ent[i].data;
          const float *A = ad + lo->off_a, *Bm = ad + lo->off_b;
          for (int o = 0; o < lo->out; o++)
            for (int k = 0; k < r; k++) {
              float b = s->lora_scale * Bm[(size_t)o * r + k];
              if (b == 0) continue;
              for (int j = 0; j < lo->in; j++) W[(size_t)o * lo->in + j] += b * A[(size_t)k * lo->in + j];
            }
        }
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if ((err = lt_st_write(path, ent, ns, errstr, errstr_size))) goto out;
  err = lt_model_config_write(c, dir, errstr, errstr_size);
out:
  free(host);
  free(ad);
  free(ent);
  return err;
}

lt_err_t lt_model_init_random(const lt_model_config_t *c, const char *dir, uint64_t seed,
                              float std, float norm_std, char *errstr, size_t errstr_size) {
  lt_err_t err;
  if ((err = ensure_dir(dir, errstr, errstr_size))) return err;
  weights_t w = {0};
  w.layer = calloc((size_t)c->num_layers, sizeof *w.layer);
  spec_t *specs = calloc(spec_max(c), sizeof *specs);
  lt_st_entry_t *ent = calloc(spec_max(c), sizeof *ent);
  float *host = NULL;
  if (!w.layer || !specs || !ent) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "init_random: out of memory");
    goto out;
  }
  size_t ns = spec_build(c, &w, specs), total = 0;
  for (size_t i = 0; i < ns; i++) total += specs[i].n;
  host = malloc(total * sizeof(float));
  if (!host) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "init_random: out of memory (%zu floats)",
                  total);
    goto out;
  }
  rng_t rng;
  rng_seed(&rng, seed);
  size_t off = 0;
  for (size_t i = 0; i < ns; i++) {
    float *d = host + off;
    int is_norm = strstr(specs[i].name, "norm") != NULL;
    for (size_t j = 0; j < specs[i].n; j++)
      d[j] = is_norm ? (float)(1.0 + norm_std * rng_normal(&rng)) : (float)(std * rng_normal(&rng));
    ent[i] = (lt_st_entry_t){.name = specs[i].name, .dtype = LT_ST_F32, .ndim = specs[i].ndim,
                             .data = d};
    ent[i].shape[0] = specs[i].shape[0];
    ent[i].shape[1] = specs[i].shape[1];
    off += specs[i].n;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if ((err = lt_st_write(path, ent, ns, errstr, errstr_size))) goto out;
  err = lt_model_config_write(c, dir, errstr, errstr_size);
out:
  free(host);
  free(ent);
  free(specs);
  free(w.layer);
  return err;
}

/* ---- sampling ---------------------------------------------------------------------------- */

static lt_err_t sampl_ensure(lt_session_t *s, int S, int max_t, int R, char *errstr,
                             size_t errstr_size) {
  sampl_t *p = &s->sp;
  if (p->block && p->S >= S && p->max_t == max_t && p->R >= R) return LT_OK;
  sampl_free(s);
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
  size_t total = 0;
#define SCOUNT(name, n, T_) total += (((n) * sizeof(T_)) + 63) & ~(size_t)63;
  SPIECES(SCOUNT)
  char *b = s->be->alloc(s->be, total);
  if (!b)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "sampling buffers (%.1f MiB): %s",
                   (double)total / (1 << 20), s->be->last_error(s->be));
  p->block = b;
#define SCARVE(name, n, T_)                                                                    \
  p->name = (T_ *)(void *)b;                                                                   \
  b += (((n) * sizeof(T_)) + 63) & ~(size_t)63;
  SPIECES(SCARVE)
#undef SPIECES
#undef SCOUNT
#undef SCARVE
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
  const lt_engine_t *e = s->eng;
  int D = c->hidden_size, F = c->intermediate_size, H = c->num_heads, KV = c->num_kv_heads,
      hd = c->head_dim, KD = KV * hd;
  be->embed_fwd(be, p->x, s->w.embed, p->tok, n, D);
  for (int l = 0; l < c->num_layers; l++) {
    const layer_w_t *lw = &s->w.layer[l];
    float *kc = p->kc + (size_t)l * p->S * p->max_t * KD,
          *vc = p->vc + (size_t)l * p->S * p->max_t * KD;
    be->rmsnorm_fwd(be, p->ln, NULL, p->x, lw->ln1, n, D, c->rms_norm_eps);
    linear_fwd(s, p->ln, n, l, M_Q, p->q, 0.0f, p->la, 0, NULL);
    linear_fwd(s, p->ln, n, l, M_K, p->k, 0.0f, p->la, 0, NULL);
    linear_fwd(s, p->ln, n, l, M_V, p->v, 0.0f, p->la, 0, NULL);
    be->rope(be, p->q, e->rope_cos, e->rope_sin, p->pos, n, H, hd, 0);
    be->rope(be, p->k, e->rope_cos, e->rope_sin, p->pos, n, KV, hd, 0);
    be->kv_store(be, kc, p->k, p->seq, p->pos, n, KD, p->max_t);
    be->kv_store(be, vc, p->v, p->seq, p->pos, n, KD, p->max_t);
    be->attn_cached(be, p->atty, p->q, kc, vc, p->seq, p->pos, n, H, KV, hd, p->max_t);
    linear_fwd(s, p->atty, n, l, M_O, p->x, 1.0f, p->la, 0, NULL);
    be->rmsnorm_fwd(be, p->ln, NULL, p->x, lw->ln2, n, D, c->rms_norm_eps);
    linear_fwd(s, p->ln, n, l, M_GATE, p->g, 0.0f, p->la, 0, NULL);
    linear_fwd(s, p->ln, n, l, M_UP, p->u, 0.0f, p->la, 0, NULL);
    be->swiglu_fwd(be, p->h, p->g, p->u, (size_t)n * F);
    linear_fwd(s, p->h, n, l, M_DOWN, p->x, 1.0f, p->la, 0, NULL);
  }
  be->rmsnorm_fwd(be, p->ln, NULL, p->x, s->w.norm, n, D, c->rms_norm_eps);
}

typedef struct cand {
  float z;
  int id;
} cand_t;

static int cand_cmp(const void *a, const void *b) {
  const cand_t *x = a, *y = b;
  if (x->z != y->z) return x->z > y->z ? -1 : 1;
  return x->id - y->id;
}

/* Picks a token from one logits row; *logp gets log softmax(logits)[token] at temperature 1. */
static int32_t pick(const float *lg, int V, const lt_sample_params_t *sp, rng_t *rng,
                    cand_t *cand, float *logp) {
  double mx = -INFINITY;
  int arg = 0;
  for (int j = 0; j < V; j++)
    if (lg[j] > mx) mx = lg[j], arg = j;
  double sum = 0;
  for (int j = 0; j < V; j++) sum += exp((double)lg[j] - mx);
  double lse = mx + log(sum);
  int tok = arg;
  if (sp->temperature > 0) {
    double t = sp->temperature, u = rng_uniform(rng);
    if (sp->top_k > 0 || sp->top_p < 1.0f) {
      for (int j = 0; j < V; j++) cand[j] = (cand_t){lg[j], j};
      qsort(cand, (size_t)V, sizeof *cand, cand_cmp);
      int k = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
      double tot = 0;
      for (int j = 0; j < k; j++) tot += exp(((double)cand[j].z - mx) / t);
      if (sp->top_p < 1.0f) { /* smallest prefix with mass >= top_p */
        double cum = 0;
        int kk = 0;
        while (kk < k) {
          cum += exp(((double)cand[kk].z - mx) / t) / tot;
          kk++;
          if (cum >= sp->top_p) break;
        }
        k = kk;
        tot = 0;
        for (int j = 0; j < k; j++) tot += exp(((double)cand[j].z - mx) / t);
      }
      double acc = 0, target = u * tot;
      tok = cand[k - 1].id;
      for (int j = 0; j < k; j++) {
        acc += exp(((double)cand[j].z - mx) / t);
        if (acc > target) {
          tok = cand[j].id;
          break;
        }
      }
    } else {
      double tot = 0;
      for (int j = 0; j < V; j++) tot += exp(((double)lg[j] - mx) / t);
      double acc = 0, target = u * tot;
      tok = V - 1;
      for (int j = 0; j < V; j++) {
        acc += exp(((double)lg[j] - mx) / t);
        if (acc > target) {
          tok = j;
          break;
        }
      }
    }
  }
  *logp = (float)((double)lg[tok] - lse);
  return tok;
}

lt_err_t lt_sample(lt_session_t *s, int n, const int32_t *const *prompts, const int *lens,
                   const lt_sample_params_t *sp, int32_t *out_tokens, float *out_logp,
                   int *out_lens, char *errstr, size_t errstr_size) {
  const lt_model_config_t *c = &s->mc;
  int V = c->vocab_size, D = c->hidden_size;
  if (n < 1) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "sample: no prompts");
  if (sp->max_tokens < 1)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "sample: max_tokens %d, expected >= 1",
                   sp->max_tokens);
  if (!(sp->temperature >= 0) || !(sp->top_p > 0 && sp->top_p <= 1) || sp->top_k < 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sample: expected temperature >= 0, top_p in (0, 1], top_k >= 0");
  int maxlen = 0;
  for (int i = 0; i < n; i++) {
    if (lens[i] < 1)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "sample: prompt %d is empty", i);
    for (int j = 0; j < lens[i]; j++)
      if (prompts[i][j] < 0 || prompts[i][j] >= V)
        return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                       "sample: prompt %d token %d = %d is outside the vocabulary [0, %d)", i, j,
                       prompts[i][j], V);
    maxlen = lens[i] > maxlen ? lens[i] : maxlen;
  }
  int max_t = maxlen + sp->max_tokens;
  if (max_t > s->eng->rope_len)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sample: prompt (%d) + max_tokens (%d) exceeds the model's %d positions",
                   maxlen, sp->max_tokens, s->eng->rope_len);
  int R = maxlen > n ? maxlen : n;
  lt_err_t err;
  if ((err = sampl_ensure(s, n, max_t, R, errstr, errstr_size))) return err;
  lt_backend_t *be = s->be;
  sampl_t *p = &s->sp;
  rng_t *rngs = malloc((size_t)n * sizeof *rngs);
  int32_t *h = malloc((size_t)3 * R * sizeof(int32_t));
  int *done = calloc((size_t)n, sizeof(int)), *rows = malloc((size_t)n * sizeof(int));
  float *lg = malloc((size_t)V * sizeof(float));
  cand_t *cand = malloc((size_t)V * sizeof *cand);
  if (!rngs || !h || !done || !rows || !lg || !cand) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "sample: out of memory");
    goto out;
  }
  int32_t *htok = h, *hseq = h + R, *hpos = h + 2 * R;
  for (int i = 0; i < n; i++) {
    rng_seed(&rngs[i], sp->seeds ? sp->seeds[i] : sp->seed + (uint64_t)i);
    out_lens[i] = 0;
  }
  /* prefill: each prompt alone, then its first token from the last position's logits */
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < lens[i]; j++) {
      htok[j] = prompts[i][j];
      hseq[j] = i;
      hpos[j] = j;
    }
    be->upload(be, p->tok, htok, (size_t)lens[i] * sizeof(int32_t));
    be->upload(be, p->seq, hseq, (size_t)lens[i] * sizeof(int32_t));
    be->upload(be, p->pos, hpos, (size_t)lens[i] * sizeof(int32_t));
    infer_rows(s, lens[i]);
    be->matmul(be, 0, 1, 1, V, D, 1.0f, p->ln + (size_t)(lens[i] - 1) * D, D, s->w.lm_head, D,
               0.0f, p->logits, V);
    be->download(be, lg, p->logits, (size_t)V * sizeof(float));
    float lp;
    int32_t t = pick(lg, V, sp, &rngs[i], cand, &lp);
    out_tokens[(size_t)i * sp->max_tokens] = t;
    if (out_logp) out_logp[(size_t)i * sp->max_tokens] = lp;
    out_lens[i] = 1;
    for (int k = 0; k < sp->n_stop; k++)
      if (sp->stop[k] == t) done[i] = 1;
    if (out_lens[i] >= sp->max_tokens) done[i] = 1;
  }
  /* decode: one row per unfinished sequence per step */
  for (;;) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if (!done[i]) {
        rows[m] = i;
        htok[m] = out_tokens[(size_t)i * sp->max_tokens + out_lens[i] - 1];
        hseq[m] = i;
        hpos[m] = lens[i] + out_lens[i] - 1;
        m++;
      }
    if (m == 0) break;
    be->upload(be, p->tok, htok, (size_t)m * sizeof(int32_t));
    be->upload(be, p->seq, hseq, (size_t)m * sizeof(int32_t));
    be->upload(be, p->pos, hpos, (size_t)m * sizeof(int32_t));
    s->rowwise = 1;
    infer_rows(s, m);
    mm_nt(s, m, V, D, 1.0f, p->ln, D, s->w.lm_head, D, 0.0f, p->logits, V);
    s->rowwise = 0;
    for (int j = 0; j < m; j++) {
      int i = rows[j];
      be->download(be, lg, p->logits + (size_t)j * V, (size_t)V * sizeof(float));
      float lp;
      int32_t t = pick(lg, V, sp, &rngs[i], cand, &lp);
      out_tokens[(size_t)i * sp->max_tokens + out_lens[i]] = t;
      if (out_logp) out_logp[(size_t)i * sp->max_tokens + out_lens[i]] = lp;
      out_lens[i]++;
      for (int k = 0; k < sp->n_stop; k++)
        if (sp->stop[k] == t) done[i] = 1;
      if (out_lens[i] >= sp->max_tokens) done[i] = 1;
    }
  }
out:
  free(rngs);
  free(h);
  free(done);
  free(rows);
  free(lg);
  free(cand);
  return err;
}
