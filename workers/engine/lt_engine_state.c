/* lt_engine_state: what leaves a session as files. Training state (LTSTATE: a versioned header
 * that pins the model and adapter shape, then parameters and AdamW moments, then a checksum;
 * written to a temporary file and renamed), tensor dumps, the HF PEFT adapter, the full model
 * (LoRA merged in) and random models for tests and the bundled base model. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "lt_engine_int.h"

/* ---- state files ------------------------------------------------------------------------- */

#define STATE_MAGIC "LTSTATE\0"
/* Version 2 ends with XXH3-64 of every byte before it; version 1 (still read) with cks_t below,
 * a chain of dependent multiplies that ran at ~2 GB/s and made restore 10x a raw read. */
#define STATE_VERSION 2u
#define STATE_VERSION_CKS 1u

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

uint64_t lt_engine_state_cks_v1(const void *p, size_t n) {
  cks_t ck = {0};
  cks_add(&ck, p, n);
  return cks_final(&ck);
}

static uint64_t le64_get(const unsigned char *b) {
  uint64_t v = 0;
  for (int j = 7; j >= 0; j--) v = (v << 8) | b[j];
  return v;
}

static void le64_put(unsigned char *b, uint64_t v) {
  for (int j = 0; j < 8; j++) b[j] = (unsigned char)(v >> (8 * j));
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

uint64_t lt_lora_checkpoint_bytes(const lt_model_config_t *c, int rank, unsigned targets) {
  uint64_t n = 0; /* parameters: as session_layout_lora lays them out */
  for (int m = 0; m < M_COUNT; m++) {
    int out, in;
    mod_shape(c, m, &out, &in);
    if (targets & (1u << m)) n += (uint64_t)rank * ((uint64_t)in + (uint64_t)out);
  }
  n *= (uint64_t)c->num_layers;
  /* state.bin: magic, header, params + m + v, checksum; then the adapter's tensors */
  return 8 + 8 * (uint64_t)H_COUNT + 3 * 4 * n + 8 + 4 * n;
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
  for (int i = 0; i < H_COUNT; i++) le64_put(hb + 8 * i, h[i]);
  XXH3_state_t *xs = XXH3_createState();
  int ok = xs && XXH3_64bits_reset(xs) == XXH_OK;
  ok = ok && fwrite(STATE_MAGIC, 1, 8, fp) == 8 && fwrite(hb, 1, sizeof hb, fp) == sizeof hb;
  if (ok) {
    XXH3_64bits_update(xs, STATE_MAGIC, 8);
    XXH3_64bits_update(xs, hb, sizeof hb);
  }
  /* payload: params, m, v, streamed through a host buffer */
  size_t chunk_n = 1 << 20;
  float *buf = malloc(chunk_n * sizeof(float));
  if (!buf) ok = 0;
  float *bufs[3] = {s->params, s->m, s->v};
  for (int k = 0; ok && k < 3; k++)
    for (size_t off = 0; ok && off < s->nparams; off += chunk_n) {
      size_t n = s->nparams - off < chunk_n ? s->nparams - off : chunk_n;
      if (be->download(be, buf, bufs[k] + off, n * sizeof(float)) != LT_OK) ok = 0;
      if (ok) XXH3_64bits_update(xs, buf, n * sizeof(float));
      if (ok && fwrite(buf, sizeof(float), n, fp) != n) ok = 0;
    }
  free(buf);
  unsigned char sb[8];
  if (ok) le64_put(sb, XXH3_64bits_digest(xs));
  XXH3_freeState(xs);
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

/* Checks the magic and header of a state file at b (len bytes: the whole file) against this
 * session's model and adapter; h gets the fields. */
static lt_err_t state_check_header(const lt_session_t *s, const unsigned char *b, size_t len,
                                   const char *path, uint64_t h[H_COUNT], char *errstr,
                                   size_t errstr_size) {
  if (len < 8 || memcmp(b, STATE_MAGIC, 8) != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: not a Lathe training state (magic \"LTSTATE\" missing)", path);
  if (len < 16) return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: truncated header", path);
  uint64_t ver = le64_get(b + 8);
  if (ver != STATE_VERSION && ver != STATE_VERSION_CKS)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "%s: state format version %llu, this build reads versions %u and %u", path,
                   (unsigned long long)ver, STATE_VERSION_CKS, STATE_VERSION);
  if (len < 8 + 8 * H_COUNT)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: truncated header", path);
  uint64_t want[H_COUNT];
  for (int i = 0; i < H_COUNT; i++) h[i] = le64_get(b + 8 + 8 * i);
  state_header(s, 0, want);
  /* shape of model and adapter must match; seed/step/cursor/rng are restored */
  for (int i = H_FULL; i <= H_TIE; i++)
    if (h[i] != want[i])
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "%s: saved for a different model or adapter: %s is %llu here, %llu in the "
                     "file",
                     path, hdr_name[i], (unsigned long long)want[i], (unsigned long long)h[i]);
  if (h[H_NPARAMS] != s->nparams)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: %llu parameters, expected %zu",
                   path, (unsigned long long)h[H_NPARAMS], s->nparams);
  return LT_OK;
}

/* Restores from a read-only mapping of the file: the header and checksum are checked over the
 * page cache's own pages, and only a file that passes is copied into the session, so a damaged
 * file changes nothing and no second host copy of the state is made (or left to scrub). */
lt_err_t lt_load_state(lt_session_t *s, const char *path, uint64_t *cursor, char *errstr,
                       size_t errstr_size) {
  lt_err_t err = LT_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return lt_errf(errstr, errstr_size, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO,
                   "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    err = lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    close(fd);
    return err;
  }
  size_t len = (size_t)st.st_size, n = s->nparams;
  size_t body = 8 + 8 * H_COUNT + 3 * n * sizeof(float);
  unsigned char hb[8 + 8 * H_COUNT];
  ssize_t got = pread(fd, hb, len < sizeof hb ? len : sizeof hb, 0);
  uint64_t h[H_COUNT];
  const unsigned char *b = NULL;
  if (got < 0)
    err = lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
  if (!err) err = state_check_header(s, hb, (size_t)got, path, h, errstr, errstr_size);
  if (!err && len < body + 8)
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                  "%s: truncated: expected %zu bytes of parameters and moments", path,
                  3 * n * sizeof(float) + 8);
  if (!err && len > body + 8)
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: trailing bytes after the checksum",
                  path);
  if (!err) {
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED)
      err = lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    else
      b = m;
  }
  close(fd);
  if (err) return err;
  uint64_t sum = h[H_VERSION] == STATE_VERSION_CKS ? lt_engine_state_cks_v1(b, body) : XXH3_64bits(b, body);
  if (sum != le64_get(b + body)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                  "%s: checksum mismatch: the file is damaged", path);
    goto out;
  }
  const unsigned char *payload = b + 8 + 8 * H_COUNT;
  size_t bytes = n * sizeof(float);
  lt_backend_t *be = s->be;
  if ((err = be->upload(be, s->params, payload, bytes)) ||
      (err = be->upload(be, s->m, payload + bytes, bytes)) ||
      (err = be->upload(be, s->v, payload + 2 * bytes, bytes))) {
    err = lt_errf(errstr, errstr_size, err, "%s: copying the state to the device failed", path);
    goto out;
  }
  be->zero(be, s->grads, n);
  s->accum = 0;
  s->cfg.seed = h[H_SEED];
  s->step = (long)h[H_STEP];
  s->fb_calls = h[H_FB_CALLS];
  for (int i = 0; i < 4; i++) s->rng.s[i] = h[H_RNG0 + i];
  if (cursor) *cursor = h[H_CURSOR];
out:
  if (b) munmap((void *)b, len);
  return err;
}

/* ---- export ------------------------------------------------------------------------------ */

static lt_err_t ensure_dir(const char *dir, char *errstr, size_t errstr_size) {
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot create directory: %s", dir,
                   strerror(errno));
  return LT_OK;
}


/* The safetensors entry of one weight of the table, over `data`. */
static lt_st_entry_t spec_entry(const char *name, const spec_t *sp, const float *data) {
  lt_st_entry_t e = {.name = name, .dtype = LT_ST_F32, .ndim = sp->ndim, .data = data};
  e.shape[0] = sp->shape[0];
  e.shape[1] = sp->shape[1];
  return e;
}

/* Names and shapes of the trainable tensors over a host copy of a flat buffer (the LoRA A and
 * B of each targeted module as PEFT names them, or the weight table). Returns the count; ent
 * and names hold room for trainable_max() entries. */
static size_t trainable_entries(const lt_session_t *s, const float *host, lt_st_entry_t *ent,
                                char (*names)[128]) {
  size_t n = 0;
  if (s->cfg.full) {
    size_t off = 0;
    for (size_t i = 0; i < s->nspecs; i++) {
      snprintf(names[n], sizeof names[n], "%s", s->specs[i].name);
      ent[n] = spec_entry(names[n], &s->specs[i], host + off);
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
                 "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                 lt_engine_mod_parent[m], lt_engine_mod_name[m], ab ? 'B' : 'A');
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

/* A host copy of one flat buffer (params or grads) with its safetensors entries. */
typedef struct snapshot {
  float *host;           /* (nparams) */
  lt_st_entry_t *ent;    /* [n] over host */
  char (*names)[128];    /* [n] the entries' names */
  size_t n;
} snapshot_t;

static void snapshot_free(const lt_session_t *s, snapshot_t *sn) {
  if (sn->host) {
    memset(sn->host, 0, s->nparams * sizeof(float));
    free(sn->host);
  }
  free(sn->ent);
  free(sn->names);
  memset(sn, 0, sizeof *sn);
}

/* Downloads `buf` (s->params or s->grads) and names its tensors; `what` prefixes messages. */
static lt_err_t snapshot_take(lt_session_t *s, const float *buf, snapshot_t *sn, const char *what,
                              char *errstr, size_t errstr_size) {
  sn->host = malloc(s->nparams * sizeof(float) + 1);
  sn->ent = calloc(trainable_max(s), sizeof *sn->ent);
  sn->names = calloc(trainable_max(s), sizeof *sn->names);
  if (!sn->host || !sn->ent || !sn->names)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: out of memory", what);
  s->be->download(s->be, sn->host, buf, s->nparams * sizeof(float));
  sn->n = trainable_entries(s, sn->host, sn->ent, sn->names);
  return LT_OK;
}

lt_err_t lt_dump_tensors(lt_session_t *s, int which, const char *path, char *errstr,
                         size_t errstr_size) {
  snapshot_t sn = {0};
  lt_err_t err = snapshot_take(s, which ? s->grads : s->params, &sn, "dump", errstr, errstr_size);
  if (!err) err = lt_st_write(path, sn.ent, sn.n, errstr, errstr_size);
  snapshot_free(s, &sn);
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
  snapshot_t sn = {0};
  json_t *cfg = NULL;
  if ((err = snapshot_take(s, s->params, &sn, "export_peft", errstr, errstr_size))) goto out;
  char path[4096];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  if ((err = lt_st_write(path, sn.ent, sn.n, errstr, errstr_size))) goto out;
  json_t *tm = json_array();
  for (int m = 0; m < M_COUNT; m++)
    if (s->cfg.targets & (1u << m)) json_array_append_new(tm, json_string(lt_engine_mod_name[m]));
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
  snapshot_free(s, &sn);
  json_decref(cfg);
  return err;
}

/* A model directory as lt_engine_open reads it: model.safetensors and config.json. */
static lt_err_t write_model_dir(const char *dir, const lt_model_config_t *c,
                                const lt_st_entry_t *ent, size_t ns, char *errstr,
                                size_t errstr_size) {
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  lt_err_t err = lt_st_write(path, ent, ns, errstr, errstr_size);
  if (err) return err;
  return lt_model_config_write(c, dir, errstr, errstr_size);
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
    ent[i] = spec_entry(e->specs[i].name, &e->specs[i], dst);
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
              for (int j = 0; j < lo->in; j++)
                W[(size_t)o * lo->in + j] += b * A[(size_t)k * lo->in + j];
            }
        }
  }
  err = write_model_dir(dir, c, ent, ns, errstr, errstr_size);
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
  size_t ns = lt_engine_spec_build(c, &w, specs), total = 0;
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
      d[j] = is_norm ? (float)(1.0 + norm_std * rng_normal(&rng))
                     : (float)(std * rng_normal(&rng));
    ent[i] = spec_entry(specs[i].name, &specs[i], d);
    off += specs[i].n;
  }
  err = write_model_dir(dir, c, ent, ns, errstr, errstr_size);
out:
  free(host);
  free(ent);
  free(specs);
  free(w.layer);
  return err;
}
