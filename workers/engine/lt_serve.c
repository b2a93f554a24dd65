/* lt_serve: continuous-batching inference over a paged KV cache with one LoRA adapter per
 * sequence (see lt_serve.h for the design). Three parts: adapters (PEFT files in memory, checked
 * against the model), the server (block pool, sequences, the step) and the token picker shared
 * with lt_sample (lt_engine_sample.c). The layer math is infer_rows' of lt_engine_sample.c, with
 * every product row-wise (matmul_rows) and attention through block tables. */
#include "lt_serve.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_engine_int.h"

/* ---- adapters --------------------------------------------------------------------------- */

struct lt_adapter {
  lt_engine_t *eng;
  lt_backend_t *be;
  int rank;
  float scale;      /* alpha / r, or alpha / sqrt(r) with use_rslora */
  unsigned targets; /* LT_TARGET_* */
  float *block;     /* device: every A and B */
  size_t floats;
  lora_t *lora;     /* [L][M_COUNT]: offsets of A (r, in) and B (out, r) in block */
};

/* adapter_config.json: r, lora_alpha, target_modules, use_rslora. */
static lt_err_t adapter_config(const char *txt, size_t len, int *r, float *scale,
                               unsigned *targets, char *errstr, size_t errstr_size) {
  json_error_t jerr;
  json_t *j = json_loadb(txt ? txt : "", txt ? len : 0, 0, &jerr);
  lt_err_t err = LT_OK;
  const char *what = "adapter_config.json";
  if (!j || !json_is_object(j)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: not a JSON object (%s)", what,
                  j ? "another type" : jerr.text);
    goto out;
  }
  json_t *jr = json_object_get(j, "r"), *ja = json_object_get(j, "lora_alpha"),
         *jt = json_object_get(j, "target_modules"), *js = json_object_get(j, "use_rslora");
  if (!json_is_integer(jr) || json_integer_value(jr) < 1 || json_integer_value(jr) > 65536) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: \"r\" must be an integer >= 1", what);
    goto out;
  }
  if (!json_is_number(ja) || !isfinite(json_number_value(ja))) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: \"lora_alpha\" must be a number", what);
    goto out;
  }
  if (js && !json_is_boolean(js) && !json_is_null(js)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: \"use_rslora\" must be a boolean",
                  what);
    goto out;
  }
  *r = (int)json_integer_value(jr);
  double a = json_number_value(ja);
  *scale = (float)(json_is_true(js) ? a / sqrt((double)*r) : a / *r);
  *targets = 0;
  size_t n = json_is_array(jt) ? json_array_size(jt) : json_is_string(jt) ? 1 : 0;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_is_array(jt) ? json_array_get(jt, i) : jt;
    int m = 0;
    while (m < M_COUNT && !(json_is_string(e) && !strcmp(json_string_value(e),
                                                          lt_engine_mod_name[m])))
      m++;
    if (m == M_COUNT) {
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                    "%s: \"target_modules\" entry %zu is not one of q_proj, k_proj, v_proj, "
                    "o_proj, gate_proj, up_proj, down_proj", what, i);
      goto out;
    }
    *targets |= 1u << m;
  }
  if (!*targets)
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                  "%s: \"target_modules\" must list at least one module", what);
out:
  json_decref(j);
  return err;
}

/* adapter_model.safetensors held in memory: its parsed header and its data section. */
typedef struct st_mem {
  json_t *hdr;
  const unsigned char *data;
  size_t data_len;
} st_mem_t;

static lt_err_t st_mem_open(const void *st, size_t len, st_mem_t *m, char *errstr,
                            size_t errstr_size) {
  const unsigned char *b = st;
  const char *what = "adapter_model.safetensors";
  memset(m, 0, sizeof *m);
  if (!st || len < 8)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: %zu bytes, too short", what, len);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
  if (hl > len - 8)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s: header length %llu is beyond the %zu bytes", what,
                   (unsigned long long)hl, len);
  json_error_t jerr;
  m->hdr = json_loadb((const char *)b + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &jerr);
  if (!m->hdr || !json_is_object(m->hdr)) {
    json_decref(m->hdr);
    m->hdr = NULL;
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: header is not a JSON object (%s)",
                   what, jerr.text);
  }
  m->data = b + 8 + hl;
  m->data_len = len - 8 - (size_t)hl;
  return LT_OK;
}

/* Checks tensor `name` (dtype F32/F16/BF16, shape [d0, d1], offsets inside the data) and
 * converts it to floats at dst. `rank_dim` (0 or 1) is the dimension that must equal r. */
static lt_err_t st_mem_take(const st_mem_t *m, const char *name, int64_t d0, int64_t d1,
                            int rank_dim, float *dst, char *errstr, size_t errstr_size) {
  json_t *t = json_object_get(m->hdr, name);
  if (!t)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "adapter: tensor %s is missing (adapter_config.json targets its module)", name);
  json_t *dt = json_object_get(t, "dtype"), *sh = json_object_get(t, "shape"),
         *of = json_object_get(t, "data_offsets");
  const char *ds = json_is_string(dt) ? json_string_value(dt) : "";
  size_t es = !strcmp(ds, "F32") ? 4 : (!strcmp(ds, "F16") || !strcmp(ds, "BF16")) ? 2 : 0;
  if (!es)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "adapter: tensor %s has dtype \"%s\", expected F32, F16 or BF16", name, ds);
  int64_t s0 = json_integer_value(json_array_get(sh, 0)),
          s1 = json_integer_value(json_array_get(sh, 1));
  if (!json_is_array(sh) || json_array_size(sh) != 2 || s0 != d0 || s1 != d1) {
    int rank_only = json_array_size(sh) == 2 && (rank_dim ? s0 == d0 : s1 == d1);
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "adapter: tensor %s has shape [%lld, %lld], expected [%lld, %lld]%s", name,
                   (long long)s0, (long long)s1, (long long)d0, (long long)d1,
                   rank_only ? " (rank differs from adapter_config.json \"r\")" : "");
  }
  json_t *o0 = json_array_get(of, 0), *o1 = json_array_get(of, 1);
  size_t n = (size_t)(d0 * d1);
  if (!json_is_integer(o0) || !json_is_integer(o1) || json_integer_value(o0) < 0 ||
      json_integer_value(o1) < json_integer_value(o0) ||
      (uint64_t)json_integer_value(o1) > m->data_len ||
      (uint64_t)(json_integer_value(o1) - json_integer_value(o0)) != n * es)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "adapter: tensor %s: data_offsets out of range or not matching its shape",
                   name);
  const unsigned char *src = m->data + json_integer_value(o0);
  for (size_t i = 0; i < n; i++) {
    if (es == 4) {
      memcpy(&dst[i], src + 4 * i, 4);
    } else {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      dst[i] = ds[0] == 'F' ? lt_st_f16_to_f32(h) : lt_st_bf16_to_f32(h);
    }
    if (!isfinite(dst[i]))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "adapter: tensor %s holds a non-finite value at %zu", name, i);
  }
  return LT_OK;
}

/* PEFT name of layer l, module m, matrix 'A' or 'B'. */
static void lora_name(char *buf, size_t n, int l, int m, char ab) {
  snprintf(buf, n, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
           lt_engine_mod_parent[m], lt_engine_mod_name[m], ab);
}

/* Fills host (a->floats) from the file; every tensor present must be one it expects. */
static lt_err_t adapter_tensors(lt_adapter_t *a, const st_mem_t *m, float *host, char *errstr,
                                size_t errstr_size) {
  const lt_model_config_t *c = &a->eng->cfg;
  char name[160];
  size_t expected = 0;
  lt_err_t err;
  for (int l = 0; l < c->num_layers; l++)
    for (int k = 0; k < M_COUNT; k++) {
      const lora_t *lo = &a->lora[(size_t)l * M_COUNT + k];
      if (!lo->on) continue;
      lora_name(name, sizeof name, l, k, 'A');
      if ((err = st_mem_take(m, name, a->rank, lo->in, 0, host + lo->off_a, errstr,
                             errstr_size)))
        return err;
      lora_name(name, sizeof name, l, k, 'B');
      if ((err = st_mem_take(m, name, lo->out, a->rank, 1, host + lo->off_b, errstr,
                             errstr_size)))
        return err;
      expected += 2;
    }
  size_t present = json_object_size(m->hdr) - (json_object_get(m->hdr, "__metadata__") != NULL);
  if (present == expected) return LT_OK;
  const char *key;
  json_t *v;
  json_object_foreach(m->hdr, key, v) {
    if (!strcmp(key, "__metadata__")) continue;
    int found = 0;
    for (int l = 0; l < c->num_layers && !found; l++)
      for (int k = 0; k < M_COUNT && !found; k++)
        for (int ab = 0; ab < 2 && !found; ab++) {
          lora_name(name, sizeof name, l, k, "AB"[ab]);
          found = a->lora[(size_t)l * M_COUNT + k].on && !strcmp(name, key);
        }
    if (!found)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "adapter: tensor %s is not a LoRA weight of a module adapter_config.json "
                     "targets in this model", key);
  }
  return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "adapter: unexpected tensors");
}

/* Zeroes host memory the compiler may not elide (a tenant's weights on their way up). */
static void host_scrub(void *p, size_t n) {
  if (!p) return;
  memset(p, 0, n);
  __asm__ __volatile__("" : : "r"(p) : "memory");
}

lt_err_t lt_adapter_load(lt_engine_t *eng, const void *st, size_t st_len, const char *cfg_json,
                         size_t cfg_len, lt_adapter_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  const lt_model_config_t *c = &eng->cfg;
  lt_adapter_t *a = calloc(1, sizeof *a);
  st_mem_t m = {0};
  float *host = NULL;
  lt_err_t err;
  if (!a || !(a->lora = calloc((size_t)c->num_layers * M_COUNT, sizeof *a->lora))) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "adapter: out of memory");
    goto err;
  }
  a->eng = eng;
  a->be = eng->be;
  if ((err = adapter_config(cfg_json, cfg_len, &a->rank, &a->scale, &a->targets, errstr,
                            errstr_size)))
    goto err;
  if (a->rank > c->hidden_size) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                  "adapter_config.json: \"r\" = %d exceeds the model's hidden size %d", a->rank,
                  c->hidden_size);
    goto err;
  }
  for (int l = 0; l < c->num_layers; l++)
    for (int k = 0; k < M_COUNT; k++) {
      lora_t *lo = &a->lora[(size_t)l * M_COUNT + k];
      if (!(a->targets & (1u << k))) continue;
      lo->on = 1;
      mod_shape(c, k, &lo->out, &lo->in);
      lo->off_a = a->floats;
      lo->off_b = a->floats + (size_t)a->rank * lo->in;
      a->floats = lo->off_b + (size_t)lo->out * a->rank;
    }
  if ((err = st_mem_open(st, st_len, &m, errstr, errstr_size))) goto err;
  if (!(host = malloc(a->floats * sizeof(float)))) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "adapter: out of memory");
    goto err;
  }
  if ((err = adapter_tensors(a, &m, host, errstr, errstr_size))) goto err;
  if (!(a->block = a->be->alloc(a->be, a->floats * sizeof(float))) ||
      a->be->upload(a->be, a->block, host, a->floats * sizeof(float))) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "adapter: %zu bytes of backend memory: %s",
                  a->floats * sizeof(float), a->be->last_error(a->be));
    goto err;
  }
  host_scrub(host, a->floats * sizeof(float));
  free(host);
  json_decref(m.hdr);
  *out = a;
  return LT_OK;
err:
  if (host) host_scrub(host, a->floats * sizeof(float));
  free(host);
  json_decref(m.hdr);
  lt_adapter_free(a);
  return err;
}

size_t lt_adapter_bytes(const lt_adapter_t *a) { return a ? a->floats * sizeof(float) : 0; }
int lt_adapter_rank(const lt_adapter_t *a) { return a ? a->rank : 0; }

void lt_adapter_free_observed(lt_adapter_t *a, void *seen) {
  if (!a) return;
  if (a->block) {
    a->be->zero(a->be, a->block, a->floats);
    if (seen) a->be->download(a->be, seen, a->block, a->floats * sizeof(float));
    a->be->free(a->be, a->block);
  }
  free(a->lora);
  free(a);
}

void lt_adapter_free(lt_adapter_t *a) { lt_adapter_free_observed(a, NULL); }

/* ---- server ----------------------------------------------------------------------------- */

/* A sequence slot. stamp/off/last are scratch of the step in progress. */
typedef struct seq {
  int open;
  const lt_adapter_t *ad;
  int nblk;       /* blocks held */
  int32_t *btab;  /* [max_blocks] block ids */
  int len;        /* positions written so far: 0..len-1 */
  long stamp;     /* the step that last saw it */
  int off;        /* its table's offset in the step's flat tables */
  int last;       /* position of its latest row in the step */
} seq_t;

/* Device buffers of one step (rows R = max_rows), one backend allocation. */
typedef struct serve_dev {
  float *x, *ln;    /* (R, D) residual stream, normed */
  float *q, *atty;  /* (R, H*hd) */
  float *k, *v;     /* (R, KV*hd) */
  float *g, *u, *h; /* (R, F) */
  float *la;        /* (3, R, D): x A^T of each adapter's rows (r <= D), per module of a set */
  float *hw;        /* (R, D) final hidden states of the rows that want logits */
  float *logits;    /* (R, V) */
  int32_t *tok, *pos, *slot, *off; /* (R) */
  int32_t *btab;    /* (R * max_blocks) the step's block tables, flat */
  void *block;
} serve_dev_t;

struct lt_serve {
  lt_engine_t *eng;
  lt_backend_t *be;
  lt_model_config_t c;
  int bt, nblocks, max_rows, max_blocks; /* max_blocks: a sequence's most (rope_len) */
  size_t layer_floats;  /* floats of one layer's K (or V) pool: nblocks * bt * KV*hd */
  float *kpool, *vpool; /* (L, nblocks * bt, KV*hd) */
  int32_t *freel;       /* free block ids, a stack */
  int nfree;
  seq_t *seqs;
  int nseqs;
  long stamp;
  serve_dev_t d;
  /* host mirrors and the step's grouping, allocated once */
  int32_t *htok, *hpos, *hslot, *hoff, *hbtab;
  int *perm;  /* [R] step position -> caller's row */
  int *inv;   /* [R] caller's row -> step position */
  int *gid;   /* [R] caller's row -> adapter group */
  int *gstart; /* [R + 1] first step position of each group */
  int *fill;   /* [R] per-group cursor while ordering */
  const lt_adapter_t **gad; /* [R] adapter of each group (NULL: base) */
  int ngroups;
  lt_mr_desc_t *mr;          /* [6R] the adapters' low-rank products of up to three modules */
};

void lt_serve_free(lt_serve_t *srv) {
  if (!srv) return;
  lt_backend_t *be = srv->be;
  size_t L = (size_t)srv->c.num_layers;
  if (srv->kpool) be->zero(be, srv->kpool, L * srv->layer_floats);
  if (srv->vpool) be->zero(be, srv->vpool, L * srv->layer_floats);
  be->free(be, srv->kpool);
  be->free(be, srv->vpool);
  be->free(be, srv->d.block);
  for (int i = 0; i < srv->nseqs; i++) free(srv->seqs[i].btab);
  free(srv->seqs);
  free(srv->freel);
  free(srv->htok);
  free(srv->perm);
  free(srv->gad);
  free(srv->mr);
  free(srv);
}

/* The step's device and host buffers for max_rows rows. */
static lt_err_t serve_buffers(lt_serve_t *srv, char *errstr, size_t errstr_size) {
  const lt_model_config_t *c = &srv->c;
  size_t R = (size_t)srv->max_rows, D = (size_t)c->hidden_size, F = (size_t)c->intermediate_size,
         QD = (size_t)c->num_heads * c->head_dim, KD = (size_t)c->num_kv_heads * c->head_dim,
         V = (size_t)c->vocab_size, TB = R * (size_t)srv->max_blocks;
#define DPIECES(X)                                                                             \
  X(x, R * D, float) X(ln, R * D, float) X(q, R * QD, float) X(atty, R * QD, float)             \
  X(k, R * KD, float) X(v, R * KD, float) X(g, R * F, float) X(u, R * F, float)                 \
  X(h, R * F, float) X(la, 3 * R * D, float) X(hw, R * D, float) X(logits, R * V, float)        \
  X(tok, R, int32_t) X(pos, R, int32_t) X(slot, R, int32_t) X(off, R, int32_t)                  \
  X(btab, TB, int32_t)
  size_t total;
  CARVE(DPIECES, srv->be, &srv->d, total);
#undef DPIECES
  if (!srv->d.block)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "serve: step buffers (%.1f MiB): %s",
                   (double)total / (1 << 20), srv->be->last_error(srv->be));
  srv->htok = malloc((4 * R + TB) * sizeof(int32_t));
  srv->perm = malloc((5 * R + 1) * sizeof(int));
  srv->gad = malloc(R * sizeof *srv->gad);
  srv->mr = malloc(6 * R * sizeof *srv->mr);
  if (!srv->htok || !srv->perm || !srv->gad || !srv->mr)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "serve: out of memory");
  srv->hpos = srv->htok + R;
  srv->hslot = srv->hpos + R;
  srv->hoff = srv->hslot + R;
  srv->hbtab = srv->hoff + R;
  srv->inv = srv->perm + R;
  srv->gid = srv->inv + R;
  srv->gstart = srv->gid + R;
  srv->fill = srv->gstart + R + 1;
  return LT_OK;
}

lt_err_t lt_serve_new(lt_engine_t *eng, const lt_serve_conf_t *conf, lt_serve_t **out,
                      char *errstr, size_t errstr_size) {
  *out = NULL;
  lt_serve_t *srv = calloc(1, sizeof *srv);
  if (!srv) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "serve: out of memory");
  lt_err_t err;
  srv->eng = eng;
  srv->be = eng->be;
  srv->c = eng->cfg;
  srv->bt = conf->block_tokens ? conf->block_tokens : 16;
  srv->max_rows = conf->max_rows ? conf->max_rows : 256;
  const lt_model_config_t *c = &srv->c;
  size_t KD = (size_t)c->num_kv_heads * c->head_dim, L = (size_t)c->num_layers;
  if (srv->bt < 1 || srv->bt > 4096 || srv->max_rows < 1 || srv->max_rows > (1 << 20)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                  "serve: block_tokens %d (expected 1..4096), max_rows %d (expected >= 1)",
                  srv->bt, srv->max_rows);
    goto err;
  }
  size_t per_block = 2 * L * (size_t)srv->bt * KD * sizeof(float);
  size_t nb = conf->kv_bytes / per_block;
  if (nb < 1) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                  "serve: kv_bytes %zu is less than one block (%zu bytes: 2 x %zu layers x %d "
                  "positions x %zu floats)", conf->kv_bytes, per_block, L, srv->bt, KD);
    goto err;
  }
  srv->nblocks = nb > (1u << 30) / (size_t)srv->bt ? (int)((1u << 30) / (size_t)srv->bt) : (int)nb;
  srv->max_blocks = (eng->rope_len + srv->bt - 1) / srv->bt;
  srv->layer_floats = (size_t)srv->nblocks * srv->bt * KD;
  srv->kpool = srv->be->alloc(srv->be, L * srv->layer_floats * sizeof(float));
  srv->vpool = srv->be->alloc(srv->be, L * srv->layer_floats * sizeof(float));
  srv->freel = malloc((size_t)srv->nblocks * sizeof *srv->freel);
  if (!srv->kpool || !srv->vpool || !srv->freel) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "serve: KV pool of %d blocks: %s",
                  srv->nblocks, srv->be->last_error(srv->be));
    goto err;
  }
  for (int i = 0; i < srv->nblocks; i++) srv->freel[i] = srv->nblocks - 1 - i;
  srv->nfree = srv->nblocks;
  if ((err = serve_buffers(srv, errstr, errstr_size))) goto err;
  *out = srv;
  return LT_OK;
err:
  lt_serve_free(srv);
  return err;
}

int lt_serve_blocks_free(const lt_serve_t *srv) { return srv->nfree; }
int lt_serve_blocks_total(const lt_serve_t *srv) { return srv->nblocks; }
int lt_serve_block_tokens(const lt_serve_t *srv) { return srv->bt; }
int lt_serve_max_rows(const lt_serve_t *srv) { return srv->max_rows; }

static seq_t *seq_get(const lt_serve_t *srv, int seq) {
  return seq >= 0 && seq < srv->nseqs && srv->seqs[seq].open ? &srv->seqs[seq] : NULL;
}

lt_err_t lt_serve_seq_open(lt_serve_t *srv, const lt_adapter_t *adapter, int *seq_out,
                           char *errstr, size_t errstr_size) {
  if (adapter && adapter->eng != srv->eng)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "serve: the adapter was loaded for another engine");
  int i = 0;
  while (i < srv->nseqs && srv->seqs[i].open) i++;
  if (i == srv->nseqs) {
    seq_t *ns = realloc(srv->seqs, (size_t)(i + 1) * sizeof *ns);
    if (!ns) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "serve: out of memory");
    srv->seqs = ns;
    memset(&ns[i], 0, sizeof ns[i]);
    if (!(ns[i].btab = calloc((size_t)srv->max_blocks, sizeof(int32_t))))
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "serve: out of memory");
    srv->nseqs++;
  }
  seq_t *s = &srv->seqs[i];
  s->open = 1;
  s->ad = adapter;
  s->nblk = 0;
  s->len = 0;
  s->stamp = 0;
  *seq_out = i;
  return LT_OK;
}

lt_err_t lt_serve_seq_reserve(lt_serve_t *srv, int seq, int n_positions, char *errstr,
                              size_t errstr_size) {
  seq_t *s = seq_get(srv, seq);
  if (!s) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "serve: sequence %d is not open",
                         seq);
  if (n_positions < 0 || n_positions > srv->eng->rope_len)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "serve: %d positions requested, the model has %d", n_positions,
                   srv->eng->rope_len);
  int need = (n_positions + srv->bt - 1) / srv->bt;
  if (need <= s->nblk) return LT_OK;
  if (need - s->nblk > srv->nfree)
    return lt_errf(errstr, errstr_size, LT_SERVE_BUSY,
                   "serve: sequence %d needs %d more KV blocks, %d free", seq, need - s->nblk,
                   srv->nfree);
  while (s->nblk < need) s->btab[s->nblk++] = srv->freel[--srv->nfree];
  return LT_OK;
}

void lt_serve_seq_close(lt_serve_t *srv, int seq) {
  seq_t *s = seq_get(srv, seq);
  if (!s) return;
  lt_backend_t *be = srv->be;
  size_t KD = (size_t)srv->c.num_kv_heads * srv->c.head_dim, span = (size_t)srv->bt * KD;
  for (int b = s->nblk - 1; b >= 0; b--) {
    size_t at = (size_t)s->btab[b] * span;
    for (int l = 0; l < srv->c.num_layers; l++) {
      be->zero(be, srv->kpool + (size_t)l * srv->layer_floats + at, span);
      be->zero(be, srv->vpool + (size_t)l * srv->layer_floats + at, span);
    }
    srv->freel[srv->nfree++] = s->btab[b];
    s->btab[b] = 0;
  }
  s->nblk = 0;
  s->len = 0;
  s->ad = NULL;
  s->open = 0;
}

int lt_serve_seq_positions(const lt_serve_t *srv, int seq) {
  const seq_t *s = seq_get(srv, seq);
  return s ? s->len : 0;
}

int lt_serve_seq_blocks(const lt_serve_t *srv, int seq, int32_t *ids, int max) {
  const seq_t *s = seq_get(srv, seq);
  if (!s) return 0;
  for (int b = 0; ids && b < s->nblk && b < max; b++) ids[b] = s->btab[b];
  return s->nblk;
}

lt_err_t lt_serve_block_read(const lt_serve_t *srv, int block, float *out, char *errstr,
                             size_t errstr_size) {
  if (block < 0 || block >= srv->nblocks)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "serve: no block %d", block);
  size_t KD = (size_t)srv->c.num_kv_heads * srv->c.head_dim, span = (size_t)srv->bt * KD;
  for (int l = 0; l < srv->c.num_layers; l++) {
    size_t at = (size_t)l * srv->layer_floats + (size_t)block * span;
    lt_err_t err = srv->be->download(srv->be, out + (size_t)(2 * l) * span, srv->kpool + at,
                                     span * sizeof(float));
    if (!err)
      err = srv->be->download(srv->be, out + (size_t)(2 * l + 1) * span, srv->vpool + at,
                              span * sizeof(float));
    if (err) return lt_errf(errstr, errstr_size, err, "serve: %s", srv->be->last_error(srv->be));
  }
  return LT_OK;
}

/* ---- the step ----------------------------------------------------------------------------- */

/* Checks every row; leaves each sequence's latest position of the step in seq->last. */
static lt_err_t step_check(lt_serve_t *srv, const lt_serve_row_t *rows, int n, float *logits_out,
                           char *errstr, size_t errstr_size) {
  if (n < 1 || n > srv->max_rows)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "serve: %d rows, expected 1..%d", n,
                   srv->max_rows);
  long st = ++srv->stamp;
  for (int i = 0; i < n; i++) {
    const lt_serve_row_t *r = &rows[i];
    seq_t *s = seq_get(srv, r->seq);
    if (!s)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "serve: row %d: sequence %d is not open",
                     i, r->seq);
    if (r->token < 0 || r->token >= srv->c.vocab_size)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "serve: row %d: token %d is outside the vocabulary [0, %d)", i, r->token,
                     srv->c.vocab_size);
    if (r->pos < 0 || r->pos >= s->nblk * srv->bt)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "serve: row %d: position %d of sequence %d is not reserved (%d are)", i,
                     r->pos, r->seq, s->nblk * srv->bt);
    int first = s->stamp != st;
    if (first ? r->pos > s->len : r->pos != s->last + 1)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "serve: row %d: position %d of sequence %d, expected %s%d", i, r->pos,
                     r->seq, first ? "at most " : "", first ? s->len : s->last + 1);
    if (r->logits && !logits_out)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "serve: row %d wants logits but logits_out is NULL", i);
    s->stamp = st;
    s->last = r->pos;
  }
  return LT_OK;
}

/* Orders rows by adapter (groups in order of first appearance, rows in order within a group):
 * perm, inv, gid, gstart, gad, ngroups. */
static void step_group(lt_serve_t *srv, const lt_serve_row_t *rows, int n) {
  srv->ngroups = 0;
  for (int i = 0; i < n; i++) {
    const lt_adapter_t *ad = srv->seqs[rows[i].seq].ad;
    int g = 0;
    while (g < srv->ngroups && srv->gad[g] != ad) g++;
    if (g == srv->ngroups) {
      srv->gad[g] = ad;
      srv->gstart[g] = 0;
      srv->ngroups++;
    }
    srv->gid[i] = g;
    srv->gstart[g]++; /* counts for now */
  }
  int at = 0;
  for (int g = 0; g < srv->ngroups; g++) {
    int cnt = srv->gstart[g];
    srv->gstart[g] = at;
    at += cnt;
  }
  srv->gstart[srv->ngroups] = at;
  int *fill = srv->fill;
  for (int g = 0; g < srv->ngroups; g++) fill[g] = srv->gstart[g];
  for (int i = 0; i < n; i++) {
    int k = fill[srv->gid[i]]++;
    srv->perm[k] = i;
    srv->inv[i] = k;
  }
}

/* Host rows in step order (tokens, positions, physical slots, table offsets, flat tables),
 * uploaded. */
static lt_err_t step_tables(lt_serve_t *srv, const lt_serve_row_t *rows, int n) {
  lt_backend_t *be = srv->be;
  long st = ++srv->stamp;
  int cur = 0;
  for (int k = 0; k < n; k++) {
    const lt_serve_row_t *r = &rows[srv->perm[k]];
    seq_t *s = &srv->seqs[r->seq];
    if (s->stamp != st) {
      s->stamp = st;
      s->off = cur;
      memcpy(srv->hbtab + cur, s->btab, (size_t)s->nblk * sizeof(int32_t));
      cur += s->nblk;
    }
    srv->htok[k] = r->token;
    srv->hpos[k] = r->pos;
    srv->hslot[k] = s->btab[r->pos / srv->bt] * srv->bt + r->pos % srv->bt;
    srv->hoff[k] = s->off;
  }
  size_t b = (size_t)n * sizeof(int32_t);
  lt_err_t err = be->upload(be, srv->d.tok, srv->htok, b);
  if (!err) err = be->upload(be, srv->d.pos, srv->hpos, b);
  if (!err) err = be->upload(be, srv->d.slot, srv->hslot, b);
  if (!err) err = be->upload(be, srv->d.off, srv->hoff, b);
  if (!err && cur) err = be->upload(be, srv->d.btab, srv->hbtab, (size_t)cur * sizeof(int32_t));
  return err;
}

/* Y[i] (n, out) = X W^T (+ b) + beta Y[i] for layer l's modules m[0..nm) (nm <= 3), all reading
 * X: one row-wise product for all rows and modules in one dispatch to the threads, then each
 * adapter targeting a module adds scale (X_g A^T) B^T to its own contiguous rows: every adapter's
 * X_g A^T of every module in one call (each group's rows of its module's third of la at its own
 * rows), then every B product in another, so q, k and v under 32 adapters cost three dispatches,
 * not 3 + 192. Grouping changes no bit: each element is the same sums in the same order. */
static void serve_linear(lt_serve_t *srv, const float *X, int n, int l, int nm, const int *m, float *const *Y,
                         float beta) {
  lt_backend_t *be = srv->be;
  const layer_w_t *lw = &srv->eng->w.layer[l];
  int out[3], in[3];
  lt_mr_desc_t base[3];
  for (int i = 0; i < nm; i++) {
    mod_shape(&srv->c, m[i], &out[i], &in[i]);
    base[i] = (lt_mr_desc_t){.M = n, .N = out[i], .K = in[i], .alpha = 1.0f, .beta = beta, .A = X, .lda = in[i],
                             .W = lw->w[m[i]], .ldw = in[i], .C = Y[i], .ldc = out[i]};
  }
  be->matmul_rows_multi(be, nm, base);
  for (int i = 0; i < nm; i++)
    if (m[i] <= M_V && lw->b[m[i]]) be->bias_add(be, Y[i], lw->b[m[i]], n, out[i]);
  int k = 0, D = srv->c.hidden_size, R = 3 * srv->max_rows;
  for (int i = 0; i < nm; i++)
    for (int g = 0; g < srv->ngroups; g++) {
      const lt_adapter_t *ad = srv->gad[g];
      if (!ad) continue;
      const lora_t *lo = &ad->lora[(size_t)l * M_COUNT + m[i]];
      if (!lo->on) continue;
      int r0 = srv->gstart[g], cnt = srv->gstart[g + 1] - r0, r = ad->rank;
      /* rank <= D: the group's rows of its module's third of la are its own */
      float *la = srv->d.la + ((size_t)i * srv->max_rows + (size_t)r0) * D;
      srv->mr[k] = (lt_mr_desc_t){.M = cnt, .N = r, .K = in[i], .alpha = 1.0f, .beta = 0.0f,
                                  .A = X + (size_t)r0 * in[i], .lda = in[i], .W = ad->block + lo->off_a,
                                  .ldw = in[i], .C = la, .ldc = r};
      srv->mr[R + k] = (lt_mr_desc_t){.M = cnt, .N = out[i], .K = r, .alpha = ad->scale, .beta = 1.0f, .A = la,
                                      .lda = r, .W = ad->block + lo->off_b, .ldw = r,
                                      .C = Y[i] + (size_t)r0 * out[i], .ldc = out[i]};
      k++;
    }
  if (k == 0) return;
  be->matmul_rows_multi(be, k, srv->mr);
  be->matmul_rows_multi(be, k, srv->mr + R);
}

/* The decoder over the step's n rows (already uploaded): keys and values into the pool, the
 * final normed hidden states into d.ln. */
static void serve_layers(lt_serve_t *srv, int n) {
  lt_backend_t *be = srv->be;
  serve_dev_t *p = &srv->d;
  const lt_model_config_t *c = &srv->c;
  const lt_engine_t *e = srv->eng;
  int D = c->hidden_size, F = c->intermediate_size, H = c->num_heads, KV = c->num_kv_heads,
      hd = c->head_dim, KD = KV * hd;
  be->embed_fwd(be, p->x, e->w.embed, p->tok, n, D);
  for (int l = 0; l < c->num_layers; l++) {
    const layer_w_t *lw = &e->w.layer[l];
    float *kc = srv->kpool + (size_t)l * srv->layer_floats,
          *vc = srv->vpool + (size_t)l * srv->layer_floats;
    be->rmsnorm_fwd(be, p->ln, NULL, p->x, lw->ln1, n, D, c->rms_norm_eps);
    serve_linear(srv, p->ln, n, l, 3, (const int[]){M_Q, M_K, M_V}, (float *const[]){p->q, p->k, p->v}, 0.0f);
    be->rope(be, p->q, e->rope_cos, e->rope_sin, p->pos, n, H, hd, 0);
    be->rope(be, p->k, e->rope_cos, e->rope_sin, p->pos, n, KV, hd, 0);
    be->kv_store_paged(be, kc, p->k, p->slot, n, KD);
    be->kv_store_paged(be, vc, p->v, p->slot, n, KD);
    be->attn_paged(be, p->atty, p->q, kc, vc, p->btab, p->off, p->pos, n, H, KV, hd, srv->bt);
    serve_linear(srv, p->atty, n, l, 1, (const int[]){M_O}, &p->x, 1.0f);
    be->rmsnorm_fwd(be, p->ln, NULL, p->x, lw->ln2, n, D, c->rms_norm_eps);
    serve_linear(srv, p->ln, n, l, 2, (const int[]){M_GATE, M_UP}, (float *const[]){p->g, p->u}, 0.0f);
    be->swiglu_fwd(be, p->h, p->g, p->u, (size_t)n * F);
    serve_linear(srv, p->h, n, l, 1, (const int[]){M_DOWN}, &p->x, 1.0f);
  }
  be->rmsnorm_fwd(be, p->ln, NULL, p->x, e->w.norm, n, D, c->rms_norm_eps);
}

lt_err_t lt_serve_step(lt_serve_t *srv, const lt_serve_row_t *rows, int n, float *logits_out,
                       char *errstr, size_t errstr_size) {
  lt_backend_t *be = srv->be;
  lt_err_t err;
  if ((err = step_check(srv, rows, n, logits_out, errstr, errstr_size))) return err;
  step_group(srv, rows, n);
  if ((err = step_tables(srv, rows, n)))
    return lt_errf(errstr, errstr_size, err, "serve: upload: %s", be->last_error(be));
  serve_layers(srv, n);
  for (int i = 0; i < n; i++) { /* positions written, whatever happens next */
    seq_t *s = &srv->seqs[rows[i].seq];
    if (rows[i].pos + 1 > s->len) s->len = rows[i].pos + 1;
  }
  int D = srv->c.hidden_size, V = srv->c.vocab_size, w = 0;
  for (int i = 0; i < n; i++)
    if (rows[i].logits)
      be->copy(be, srv->d.hw + (size_t)w++ * D, srv->d.ln + (size_t)srv->inv[i] * D, (size_t)D);
  if (w == 0) return LT_OK;
  be->matmul_rows(be, w, V, D, 1.0f, srv->d.hw, D, srv->eng->w.lm_head, D, 0.0f, srv->d.logits,
                  V);
  if ((err = be->download(be, logits_out, srv->d.logits, (size_t)w * V * sizeof(float))))
    return lt_errf(errstr, errstr_size, err, "serve: download: %s", be->last_error(be));
  return LT_OK;
}

/* ---- token picker ------------------------------------------------------------------------- */

typedef struct cand {
  float z;
  int id;
} cand_t;

static int cand_cmp(const void *a, const void *b) {
  const cand_t *x = a, *y = b;
  if (x->z != y->z) return x->z > y->z ? -1 : 1;
  return x->id - y->id;
}

lt_err_t lt_picker_init(lt_picker_t *p, int V, uint64_t seed, char *errstr, size_t errstr_size) {
  memset(p, 0, sizeof *p);
  if (V < 1) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "picker: vocabulary %d", V);
  if (!(p->scratch = malloc((size_t)V * sizeof(cand_t))))
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "picker: out of memory");
  p->V = V;
  lt_picker_reseed(p, seed);
  return LT_OK;
}

void lt_picker_reseed(lt_picker_t *p, uint64_t seed) {
  rng_t r;
  rng_seed(&r, seed);
  memcpy(p->s, r.s, sizeof p->s);
}

void lt_picker_free(lt_picker_t *p) {
  if (!p) return;
  free(p->scratch);
  memset(p, 0, sizeof *p);
}

static void cand_swap(cand_t *c, size_t a, size_t b) {
  cand_t x = c[a];
  c[a] = c[b];
  c[b] = x;
}

/* Moves the best candidates of c[lo, hi) (cand_cmp's order: larger z, then lower id) into
 * c[lo, k), in no order: a quickselect, O(hi - lo) on average. lo <= k <= hi. */
static void select_best(cand_t *c, size_t lo, size_t hi, size_t k) {
  while (hi - lo > 1 && k > lo && k < hi) {
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (cand_cmp(&c[mid], &c[lo]) < 0) cand_swap(c, mid, lo); /* the median of three as pivot */
    if (cand_cmp(&c[last], &c[lo]) < 0) cand_swap(c, last, lo);
    if (cand_cmp(&c[last], &c[mid]) < 0) cand_swap(c, last, mid);
    cand_swap(c, mid, last);
    size_t at = lo;
    for (size_t i = lo; i < last; i++)
      if (cand_cmp(&c[i], &c[last]) < 0) cand_swap(c, i, at++);
    cand_swap(c, at, last); /* the pivot in its place: better ones before it, worse after */
    if (k == at || k == at + 1) return;
    if (k < at) hi = at;
    else lo = at + 1;
  }
}

/* Top-k / top-p sampling at temperature t; u uniform in [0, 1). The candidates in cand_cmp's
 * order, but only as many as the truncation reads are put in it (the vocabulary is not sorted
 * whole, under the sampler's lock, at every token): the top k, or a prefix grown until it holds
 * the top_p mass, whose total is summed over the whole vocabulary in id order. */
static int32_t pick_truncated(const float *lg, int V, const lt_sample_params_t *sp, double mx,
                              double t, double u, cand_t *cand) {
  for (int j = 0; j < V; j++) cand[j] = (cand_t){lg[j], j};
  size_t n = (size_t)V, k = sp->top_k > 0 && sp->top_k < V ? (size_t)sp->top_k : n, sorted = 0;
  double tot = 0;
  if (k < n || sp->top_p >= 1.0f) { /* the top k in order (all of them when only top_k >= V) */
    select_best(cand, 0, n, k);
    qsort(cand, k, sizeof *cand, cand_cmp);
    sorted = k;
    for (size_t j = 0; j < k; j++) tot += exp(((double)cand[j].z - mx) / t);
  } else {
    for (size_t j = 0; j < n; j++) tot += exp(((double)lg[j] - mx) / t);
  }
  if (sp->top_p < 1.0f) { /* smallest prefix with mass >= top_p */
    double cum = 0;
    size_t kk = 0;
    for (size_t want = 64;; want *= 4) {
      if (want > k) want = k;
      if (want > sorted) { /* the next best, in order, after those sorted already */
        select_best(cand, sorted, n, want);
        qsort(cand + sorted, want - sorted, sizeof *cand, cand_cmp);
        sorted = want;
      }
      while (kk < want) {
        cum += exp(((double)cand[kk].z - mx) / t) / tot;
        kk++;
        if (cum >= sp->top_p) break;
      }
      if (cum >= sp->top_p || want == k) break;
    }
    k = kk;
    tot = 0;
    for (size_t j = 0; j < k; j++) tot += exp(((double)cand[j].z - mx) / t);
  }
  double acc = 0, target = u * tot;
  for (size_t j = 0; j < k; j++) {
    acc += exp(((double)cand[j].z - mx) / t);
    if (acc > target) return cand[j].id;
  }
  return cand[k - 1].id;
}

/* The top_n most likely tokens (lowest id on ties), by insertion into a short sorted list. */
static void pick_top(const float *lg, int V, double lse, int top_n, int32_t *ids, float *lp) {
  int have = 0;
  for (int j = 0; j < V; j++) {
    int at = have;
    while (at > 0 && lg[ids[at - 1]] < lg[j]) at--;
    if (at >= top_n) continue;
    int end = have < top_n ? have : top_n - 1;
    for (int k = end; k > at; k--) ids[k] = ids[k - 1];
    ids[at] = j;
    if (have < top_n) have++;
  }
  for (int k = 0; k < have; k++) lp[k] = (float)((double)lg[ids[k]] - lse);
}

int32_t lt_picker_truncated(const lt_picker_t *p, const float *lg, const lt_sample_params_t *sp, double u) {
  double mx = -INFINITY;
  for (int j = 0; j < p->V; j++)
    if (lg[j] > mx) mx = lg[j];
  return pick_truncated(lg, p->V, sp, mx, sp->temperature, u, p->scratch);
}

int32_t lt_picker_pick(lt_picker_t *p, const float *lg, const lt_sample_params_t *sp,
                       float *logp, int top_n, int32_t *top_ids, float *top_logp) {
  int V = p->V;
  double mx = -INFINITY;
  int arg = 0;
  for (int j = 0; j < V; j++)
    if (lg[j] > mx) mx = lg[j], arg = j;
  double sum = 0;
  for (int j = 0; j < V; j++) sum += exp((double)lg[j] - mx);
  double lse = mx + log(sum);
  int tok = arg;
  if (sp->temperature > 0) {
    rng_t r;
    memcpy(r.s, p->s, sizeof r.s);
    double t = sp->temperature, u = rng_uniform(&r);
    memcpy(p->s, r.s, sizeof r.s);
    if (sp->top_k > 0 || sp->top_p < 1.0f) {
      tok = pick_truncated(lg, V, sp, mx, t, u, p->scratch);
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
  if (logp) *logp = (float)((double)lg[tok] - lse);
  if (top_n > LT_PICKER_MAX_TOP) top_n = LT_PICKER_MAX_TOP;
  if (top_n > V) top_n = V;
  if (top_n > 0) pick_top(lg, V, lse, top_n, top_ids, top_logp);
  return tok;
}
