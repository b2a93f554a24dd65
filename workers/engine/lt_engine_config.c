/* lt_engine_config: the model's config.json (parse and write) and the parameter table, the one
 * list of every weight with its HF name and shape that loading, full-parameter sessions, export
 * and random models all walk. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lt_engine_int.h"

const char *const lt_engine_mod_name[M_COUNT] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
const char *const lt_engine_mod_parent[M_COUNT] = {"self_attn", "self_attn", "self_attn",
                                                   "self_attn", "mlp",       "mlp",
                                                   "mlp"};

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

/* model_type, hidden_act and mlp_bias: the architecture must be the Llama family we run. */
static lt_err_t config_check_family(json_t *root, const char *name, char *errstr,
                                    size_t errstr_size) {
  json_t *mt = json_object_get(root, "model_type");
  if (mt && !(json_is_string(mt) && (strcmp(json_string_value(mt), "llama") == 0 ||
                                     strcmp(json_string_value(mt), "qwen2") == 0 ||
                                     strcmp(json_string_value(mt), "mistral") == 0)))
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "%s: model_type %s is not supported (expected llama, qwen2 or mistral)", name,
                   json_is_string(mt) ? json_string_value(mt) : "(not a string)");
  json_t *act = json_object_get(root, "hidden_act");
  if (act && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0))
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "%s: hidden_act must be \"silu\" (SwiGLU)", name);
  if (json_is_true(json_object_get(root, "mlp_bias")))
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported",
                   name);
  return LT_OK;
}

/* The sizes, norm epsilon and RoPE base, with the divisibility the attention layout needs. */
static lt_err_t config_sizes(json_t *root, const char *name, lt_model_config_t *out,
                             char *errstr, size_t errstr_size) {
  lt_err_t err;
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
    return err;
  if (out->hidden_size % out->num_heads != 0 && !json_object_get(root, "head_dim"))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s: hidden_size %d is not a multiple of num_attention_heads %d", name,
                   out->hidden_size, out->num_heads);
  if ((err = cfg_int(root, name, "head_dim", 0, out->hidden_size / out->num_heads,
                     &out->head_dim, errstr, errstr_size)))
    return err;
  if (out->head_dim % 2)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: head_dim %d must be even (RoPE)",
                   name, out->head_dim);
  if (out->num_heads % out->num_kv_heads != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", name,
                   out->num_heads, out->num_kv_heads);
  return LT_OK;
}

/* rope_scaling: null, "default" or "linear" with a factor >= 1 (sets rope_linear_factor). */
static lt_err_t config_rope_scaling(json_t *root, const char *name, lt_model_config_t *out,
                                    char *errstr, size_t errstr_size) {
  out->rope_linear_factor = 1.0f;
  json_t *rs = json_object_get(root, "rope_scaling");
  if (!rs || json_is_null(rs)) return LT_OK;
  json_t *ty = json_object_get(rs, "rope_type");
  if (!ty) ty = json_object_get(rs, "type");
  json_t *fa = json_object_get(rs, "factor");
  if (!json_is_object(rs) || !json_is_string(ty))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s: rope_scaling must be null or an object with \"type\"", name);
  if (strcmp(json_string_value(ty), "default") == 0) return LT_OK; /* same as null */
  if (strcmp(json_string_value(ty), "linear") != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "%s: rope_scaling type \"%s\" is not supported (null or \"linear\")", name,
                   json_string_value(ty));
  if (!json_is_number(fa) || !(json_number_value(fa) >= 1.0))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s: rope_scaling.factor must be a number >= 1", name);
  out->rope_linear_factor = (float)json_number_value(fa);
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
  if ((err = config_check_family(root, name, errstr, errstr_size)) ||
      (err = config_sizes(root, name, out, errstr, errstr_size)))
    goto out;
  json_t *tie = json_object_get(root, "tie_word_embeddings");
  out->tie_embeddings = tie ? json_is_true(tie) : 0;
  out->qkv_bias = json_is_true(json_object_get(root, "attention_bias"));
  err = config_rope_scaling(root, name, out, errstr, errstr_size);
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

size_t lt_engine_spec_build(const lt_model_config_t *c, weights_t *w, spec_t *s) {
  size_t n = 0;
  int D = c->hidden_size, V = c->vocab_size;
  spec_add(s, &n, &w->embed, 2, V, D, "model.embed_tokens.weight");
  for (int l = 0; l < c->num_layers; l++) {
    layer_w_t *lw = &w->layer[l];
    spec_add(s, &n, &lw->ln1, 1, D, 0, "model.layers.%d.input_layernorm.weight", l);
    for (int m = 0; m < M_COUNT; m++) {
      int o, i;
      mod_shape(c, m, &o, &i);
      spec_add(s, &n, &lw->w[m], 2, o, i, "model.layers.%d.%s.%s.weight", l,
               lt_engine_mod_parent[m], lt_engine_mod_name[m]);
      if (m <= M_V && c->qkv_bias)
        spec_add(s, &n, &lw->b[m], 1, o, 0, "model.layers.%d.%s.%s.bias", l,
                 lt_engine_mod_parent[m], lt_engine_mod_name[m]);
    }
    spec_add(s, &n, &lw->ln2, 1, D, 0, "model.layers.%d.post_attention_layernorm.weight", l);
  }
  spec_add(s, &n, &w->norm, 1, D, 0, "model.norm.weight");
  if (!c->tie_embeddings) spec_add(s, &n, &w->lm_head, 2, V, D, "lm_head.weight");
  return n;
}
