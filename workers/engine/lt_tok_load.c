/* lt_tok_load: reads a Hugging Face tokenizer.json into struct lt_tok, refusing with
 * LT_ERR_UNSUPPORTED (naming the field) whatever the encoder would not reproduce exactly:
 * normalizers, models other than BPE, byte fallback, dropout, subword affixes, pre-tokenizer
 * steps after ByteLevel. Loading runs in phases: the model's options, the id table (vocabulary
 * then added tokens), the byte tokens, the merges, the pre-tokenizer and the decoder. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>

#include "lt_tok_int.h"

/* A string JSON field that may be absent or null. */
static lt_err_t opt_string(json_t *obj, const char *key, const char *path, const char **out,
                           char *errstr, size_t errstr_size) {
  json_t *v = json_object_get(obj, key);
  *out = NULL;
  if (!v || json_is_null(v)) return LT_OK;
  if (!json_is_string(v))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "tokenizer.json: %s.%s: expected a string",
                   path, key);
  *out = json_string_value(v);
  return LT_OK;
}

static lt_err_t opt_bool(json_t *obj, const char *key, const char *path, int dflt, int *out,
                         char *errstr, size_t errstr_size) {
  json_t *v = json_object_get(obj, key);
  *out = dflt;
  if (!v || json_is_null(v)) return LT_OK;
  if (!json_is_boolean(v))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: %s.%s: expected true or false", path, key);
  *out = json_is_true(v);
  return LT_OK;
}

lt_err_t lt_tok_compile_regex(const char *pattern, size_t len, pcre2_code **out,
                              const char *path, char *errstr, size_t errstr_size) {
  int errcode;
  PCRE2_SIZE erroff;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &errcode,
                                 &erroff, NULL);
  if (!re) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(errcode, msg, sizeof msg);
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: %s: regex not supported at offset %zu: %s", path,
                   (size_t)erroff, (const char *)msg);
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is off */
  *out = re;
  return LT_OK;
}

static lt_err_t add_step(lt_tok_t *tok, pre_step_t step, char *errstr, size_t errstr_size) {
  pre_step_t *s = realloc(tok->steps, (tok->n_steps + 1) * sizeof *s);
  if (!s) {
    pcre2_code_free(step.re);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
  }
  tok->steps = s;
  tok->steps[tok->n_steps++] = step;
  return LT_OK;
}

/* A Split step: a regex, or a literal quoted as one; behavior Isolated keeps the matches as
 * pre-tokens, Removed drops them. */
static lt_err_t load_split(lt_tok_t *tok, json_t *pt, const char *path, char *errstr,
                           size_t errstr_size) {
  lt_err_t err;
  char sub[256];
  json_t *pat = json_object_get(pt, "pattern");
  json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
  json_t *lit = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
  if (!json_is_string(rx) && !json_is_string(lit))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: %s.pattern: expected {\"Regex\": string} or {\"String\": "
                   "string}",
                   path);
  const char *behavior;
  int invert;
  if ((err = opt_string(pt, "behavior", path, &behavior, errstr, errstr_size)) ||
      (err = opt_bool(pt, "invert", path, 0, &invert, errstr, errstr_size)))
    return err;
  if (invert)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: %s.invert: only false is supported", path);
  pre_step_t st = {.kind = STEP_REGEX};
  if (!behavior || strcmp(behavior, "Isolated") == 0)
    st.removed = 0;
  else if (strcmp(behavior, "Removed") == 0)
    st.removed = 1;
  else
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: %s.behavior: \"%s\" is not supported (expected \"Isolated\" "
                   "or \"Removed\")",
                   path, behavior);
  snprintf(sub, sizeof sub, "%s.pattern", path);
  if (json_is_string(rx)) {
    if ((err = lt_tok_compile_regex(json_string_value(rx), json_string_length(rx), &st.re, sub,
                                    errstr, errstr_size)))
      return err;
  } else {
    /* A literal: quote it with \Q..\E unless it contains \E itself. */
    const char *s = json_string_value(lit);
    if (strstr(s, "\\E"))
      return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                     "tokenizer.json: %s: a String pattern containing \\E is not supported",
                     sub);
    size_t n = strlen(s);
    char *q = malloc(n + 5);
    if (!q) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
    memcpy(q, "\\Q", 2);
    memcpy(q + 2, s, n);
    memcpy(q + 2 + n, "\\E", 3);
    err = lt_tok_compile_regex(q, n + 4, &st.re, sub, errstr, errstr_size);
    free(q);
    if (err) return err;
  }
  return add_step(tok, st, errstr, errstr_size);
}

/* One pre-tokenizer object: ByteLevel, Split, Digits, or a Sequence of them. ByteLevel must
 * come last (it is the byte mapping; splits after it would see mapped text). */
static lt_err_t load_pre_tokenizer(lt_tok_t *tok, json_t *pt, const char *path, int *saw_bytelevel,
                                   char *errstr, size_t errstr_size) {
  lt_err_t err;
  if (!json_is_object(pt))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "tokenizer.json: %s: expected an object",
                   path);
  const char *type;
  if ((err = opt_string(pt, "type", path, &type, errstr, errstr_size))) return err;
  if (!type)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: %s.type: expected a string such as \"ByteLevel\"", path);
  if (*saw_bytelevel)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: %s: a %s step after ByteLevel is not supported", path, type);
  char sub[256];
  if (strcmp(type, "Sequence") == 0) {
    json_t *arr = json_object_get(pt, "pretokenizers");
    if (!json_is_array(arr))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: %s.pretokenizers: expected an array", path);
    for (size_t i = 0; i < json_array_size(arr); i++) {
      snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
      if ((err = load_pre_tokenizer(tok, json_array_get(arr, i), sub, saw_bytelevel, errstr,
                                    errstr_size)))
        return err;
    }
    return LT_OK;
  }
  if (strcmp(type, "ByteLevel") == 0) {
    int use_regex;
    if ((err = opt_bool(pt, "add_prefix_space", path, 0, &tok->add_prefix_space, errstr,
                        errstr_size)) ||
        (err = opt_bool(pt, "use_regex", path, 1, &use_regex, errstr, errstr_size)))
      return err;
    *saw_bytelevel = 1;
    if (use_regex) {
      pre_step_t st = {.kind = STEP_REGEX};
      snprintf(sub, sizeof sub, "%s (GPT-2 pattern)", path);
      if ((err = lt_tok_compile_regex(LT_TOK_GPT2_PATTERN, sizeof LT_TOK_GPT2_PATTERN - 1, &st.re,
                                      sub, errstr, errstr_size)))
        return err;
      return add_step(tok, st, errstr, errstr_size);
    }
    return LT_OK;
  }
  if (strcmp(type, "Split") == 0) return load_split(tok, pt, path, errstr, errstr_size);
  if (strcmp(type, "Digits") == 0) {
    pre_step_t st = {.kind = STEP_DIGITS};
    if ((err = opt_bool(pt, "individual_digits", path, 0, &st.individual, errstr, errstr_size)))
      return err;
    return add_step(tok, st, errstr, errstr_size);
  }
  return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                 "tokenizer.json: %s.type: \"%s\" is not supported (expected ByteLevel, Split, "
                 "Digits or Sequence)",
                 path, type);
}

static int cmp_added_len(const void *a, const void *b) {
  const added_tok_t *x = a, *y = b;
  if (x->len != y->len) return x->len > y->len ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Splits a merge entry into its two halves; returns 0 or an error. */
static lt_err_t merge_parts(json_t *m, size_t i, const char **a, size_t *alen, const char **b,
                            size_t *blen, char *errstr, size_t errstr_size) {
  if (json_is_string(m)) {
    const char *s = json_string_value(m);
    const char *sp = strchr(s, ' ');
    if (!sp || sp == s || sp[1] == '\0' || strchr(sp + 1, ' '))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: model.merges[%zu]: expected \"left right\" (two tokens "
                     "separated by one space), got \"%.40s\"",
                     i, s);
    *a = s, *alen = (size_t)(sp - s), *b = sp + 1, *blen = strlen(sp + 1);
    return LT_OK;
  }
  if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
      json_is_string(json_array_get(m, 1))) {
    *a = json_string_value(json_array_get(m, 0));
    *alen = json_string_length(json_array_get(m, 0));
    *b = json_string_value(json_array_get(m, 1));
    *blen = json_string_length(json_array_get(m, 1));
    return LT_OK;
  }
  return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                 "tokenizer.json: model.merges[%zu]: expected a string \"left right\" or an "
                 "array of two strings",
                 i);
}

static int pairmap_init(pairmap_t *m, size_t want) {
  size_t cap = map_cap(want);
  m->key = calloc(cap, sizeof *m->key);
  m->rank = malloc(cap * sizeof *m->rank);
  m->merged = malloc(cap * sizeof *m->merged);
  m->cap = cap;
  return m->key && m->rank && m->merged ? 0 : -1;
}

/* model: type BPE and only the options that leave byte-level BPE deterministic; *unk gets
 * unk_token (NULL when absent). */
static lt_err_t load_model_options(lt_tok_t *tok, json_t *model, const char **unk,
                                   char *errstr, size_t errstr_size) {
  lt_err_t err;
  const char *mtype;
  if ((err = opt_string(model, "type", "model", &mtype, errstr, errstr_size))) return err;
  if (!mtype || strcmp(mtype, "BPE") != 0)
    return lt_errf(errstr, errstr_size, mtype ? LT_ERR_UNSUPPORTED : LT_ERR_INVALID,
                   "tokenizer.json: model.type: expected \"BPE\", got %s%s%s", mtype ? "\"" : "",
                   mtype ? mtype : "nothing", mtype ? "\"" : "");
  int byte_fallback, fuse_unk;
  const char *csp, *ews;
  if ((err = opt_bool(model, "byte_fallback", "model", 0, &byte_fallback, errstr, errstr_size)) ||
      (err = opt_bool(model, "fuse_unk", "model", 0, &fuse_unk, errstr, errstr_size)) ||
      (err = opt_bool(model, "ignore_merges", "model", 0, &tok->ignore_merges, errstr,
                      errstr_size)) ||
      (err = opt_string(model, "continuing_subword_prefix", "model", &csp, errstr,
                        errstr_size)) ||
      (err = opt_string(model, "end_of_word_suffix", "model", &ews, errstr, errstr_size)) ||
      (err = opt_string(model, "unk_token", "model", unk, errstr, errstr_size)))
    return err;
  if (byte_fallback)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: model.byte_fallback: only false is supported (byte-level BPE)");
  if ((csp && *csp) || (ews && *ews))
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: model.%s: only an empty string or null is supported",
                   csp && *csp ? "continuing_subword_prefix" : "end_of_word_suffix");
  json_t *dropout = json_object_get(model, "dropout");
  if (dropout && !json_is_null(dropout) &&
      !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: model.dropout: only null is supported (deterministic BPE)");
  return LT_OK;
}

/* Checks every id of model.vocab and added_tokens; *max_id gets the largest. */
static lt_err_t load_check_ids(json_t *vocab, json_t *added, size_t n_added, json_int_t *max_id,
                               char *errstr, size_t errstr_size) {
  *max_id = -1;
  const char *key;
  json_t *val;
  json_object_foreach(vocab, key, val) {
    if (!json_is_integer(val) || json_integer_value(val) < 0 ||
        json_integer_value(val) >= (1 << 24))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: model.vocab[\"%.40s\"]: expected an integer id in "
                     "[0, 16777216)",
                     key);
    if (json_integer_value(val) > *max_id) *max_id = json_integer_value(val);
  }
  for (size_t i = 0; i < n_added; i++) {
    json_t *a = json_array_get(added, i);
    json_t *id = json_object_get(a, "id");
    json_t *content = json_object_get(a, "content");
    if (!json_is_object(a) || !json_is_integer(id) || json_integer_value(id) < 0 ||
        json_integer_value(id) >= (1 << 24))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: added_tokens[%zu].id: expected an integer id in "
                     "[0, 16777216)",
                     i);
    if (!json_is_string(content) || json_string_length(content) == 0)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: added_tokens[%zu].content: expected a non-empty string", i);
    if (json_integer_value(id) > *max_id) *max_id = json_integer_value(id);
  }
  if (*max_id < 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: model.vocab: expected at least one token");
  return LT_OK;
}

/* The id table sized for max_id, and the vocabulary in it. */
static lt_err_t load_vocab(lt_tok_t *tok, json_t *vocab, size_t n_added, json_int_t max_id,
                           char *errstr, size_t errstr_size) {
  const char *key;
  json_t *val;
  tok->n_ids = (int32_t)max_id + 1;
  tok->entries = calloc((size_t)tok->n_ids, sizeof *tok->entries);
  if (!tok->entries ||
      lt_tok_strmap_init(&tok->vocab, json_object_size(vocab) + n_added))
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");

  json_object_foreach(vocab, key, val) {
    int32_t id = (int32_t)json_integer_value(val);
    size_t n = strlen(key);
    tok_entry_t *te = &tok->entries[id];
    if (te->str)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: model.vocab[\"%.40s\"]: id %d is already used by "
                     "\"%.40s\"",
                     key, id, te->str);
    if (!(te->str = strdup(key)))
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
    te->len = (uint32_t)n;
    if (lt_tok_strmap_put(&tok->vocab, te->str, n, id))
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
  }
  return LT_OK;
}

/* The added tokens: into the id table (or matching the vocabulary entry at their id), and the
 * list the encoder scans, longest first. */
static lt_err_t load_added(lt_tok_t *tok, json_t *added, size_t n_added, char *errstr,
                           size_t errstr_size) {
  lt_err_t err;
  tok->added_list = calloc(n_added ? n_added : 1, sizeof *tok->added_list);
  if (!tok->added_list)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
  for (size_t i = 0; i < n_added; i++) {
    json_t *a = json_array_get(added, i);
    int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
    json_t *content = json_object_get(a, "content");
    const char *s = json_string_value(content);
    size_t n = json_string_length(content);
    char path[64];
    snprintf(path, sizeof path, "added_tokens[%zu]", i);
    added_tok_t *at = &tok->added_list[tok->n_added];
    tok_entry_t *te = &tok->entries[id];
    if ((err = opt_bool(a, "special", path, 0, &at->special, errstr, errstr_size)) ||
        (err = opt_bool(a, "lstrip", path, 0, &at->lstrip, errstr, errstr_size)) ||
        (err = opt_bool(a, "rstrip", path, 0, &at->rstrip, errstr, errstr_size)))
      return err;
    if (te->str && (te->len != n || memcmp(te->str, s, n) != 0))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: %s.id: id %d is already the vocabulary token \"%.40s\"",
                     path, id, te->str);
    if (!te->str) {
      if (!(te->str = malloc(n + 1)))
        return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
      memcpy(te->str, s, n + 1);
      te->len = (uint32_t)n;
    }
    if (lt_tok_strmap_put(&tok->vocab, te->str, n, id))
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
    te->added = at->special ? 2 : 1;
    at->s = te->str;
    at->len = n;
    at->id = id;
    tok->added_first[(unsigned char)s[0]] = 1;
    tok->n_added++;
  }
  qsort(tok->added_list, tok->n_added, sizeof *tok->added_list, cmp_added_len);
  return LT_OK;
}

/* The token of each byte (bytes_to_unicode) and the inverse map the decoder uses. */
static void load_byte_tokens(lt_tok_t *tok) {
  byte_unicode_table(tok->cp_of_byte);
  memset(tok->byte_of_cp, 0xff, sizeof tok->byte_of_cp);
  for (int b = 0; b < 256; b++) {
    char u[4];
    size_t n = utf8_put(u, tok->cp_of_byte[b]);
    tok->byte_id[b] = strmap_get(&tok->vocab, u, n);
    tok->byte_of_cp[tok->cp_of_byte[b]] = (int16_t)b;
  }
}

/* model.merges into the pair map; a merge's rank is its index, the first occurrence wins. */
static lt_err_t load_merges(lt_tok_t *tok, json_t *model, char *errstr, size_t errstr_size) {
  lt_err_t err = LT_OK;
  json_t *merges = json_object_get(model, "merges");
  if (merges && !json_is_array(merges))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: model.merges: expected an array");
  size_t n_merges = merges ? json_array_size(merges) : 0;
  if (pairmap_init(&tok->merges, n_merges + 1))
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
  char *buf = NULL;
  size_t buf_cap = 0;
  for (size_t i = 0; i < n_merges; i++) {
    const char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    if ((err = merge_parts(json_array_get(merges, i), i, &a, &alen, &b, &blen, errstr,
                           errstr_size)))
      goto out;
    int32_t ia = strmap_get(&tok->vocab, a, alen), ib = strmap_get(&tok->vocab, b, blen);
    if (alen + blen + 1 > buf_cap) {
      buf_cap = (alen + blen + 1) * 2;
      char *nb = realloc(buf, buf_cap);
      if (!nb) {
        err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
        goto out;
      }
      buf = nb;
    }
    memcpy(buf, a, alen);
    memcpy(buf + alen, b, blen);
    int32_t im = strmap_get(&tok->vocab, buf, alen + blen);
    if (ia < 0 || ib < 0 || im < 0) {
      const char *bad = ia < 0 ? a : ib < 0 ? b : buf;
      size_t bad_len = ia < 0 ? alen : ib < 0 ? blen : alen + blen;
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                    "tokenizer.json: model.merges[%zu]: token \"%.*s\" is not in model.vocab", i,
                    (int)(bad_len > 40 ? 40 : bad_len), bad);
      goto out;
    }
    uint64_t k = pair_key(ia, ib);
    size_t slot = pairmap_slot(&tok->merges, k);
    if (!tok->merges.key[slot]) { /* the first (lowest-ranked) occurrence wins */
      tok->merges.key[slot] = k;
      tok->merges.rank[slot] = (int32_t)i;
      tok->merges.merged[slot] = im;
    }
  }
out:
  free(buf);
  return err;
}

/* The pre-tokenizer (ByteLevel is required: it is what makes this byte-level BPE) and the
 * decoder (ByteLevel or null). */
static lt_err_t load_pre_and_decoder(lt_tok_t *tok, json_t *root, char *errstr,
                                     size_t errstr_size) {
  lt_err_t err;
  json_t *pt = json_object_get(root, "pre_tokenizer");
  if (!pt || json_is_null(pt))
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: pre_tokenizer: expected a ByteLevel pre-tokenizer, got null");
  int saw_bytelevel = 0;
  if ((err = load_pre_tokenizer(tok, pt, "pre_tokenizer", &saw_bytelevel, errstr, errstr_size)))
    return err;
  if (!saw_bytelevel)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: pre_tokenizer: expected a ByteLevel step (byte-level BPE)");
  json_t *dec = json_object_get(root, "decoder");
  if (dec && !json_is_null(dec)) {
    const char *dtype;
    if ((err = opt_string(dec, "type", "decoder", &dtype, errstr, errstr_size))) return err;
    if (!json_is_object(dec) || !dtype || strcmp(dtype, "ByteLevel") != 0)
      return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                     "tokenizer.json: decoder: expected {\"type\": \"ByteLevel\"} or null");
  }
  return LT_OK;
}

static lt_err_t load_root(lt_tok_t *tok, json_t *root, char *errstr, size_t errstr_size) {
  lt_err_t err;
  if (!json_is_object(root))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: expected a JSON object at the top level");
  json_t *norm = json_object_get(root, "normalizer");
  if (norm && !json_is_null(norm))
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "tokenizer.json: normalizer: only null is supported (byte-level BPE without "
                   "normalization)");
  json_t *model = json_object_get(root, "model");
  if (!json_is_object(model))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "tokenizer.json: model: expected an object");
  const char *unk;
  if ((err = load_model_options(tok, model, &unk, errstr, errstr_size))) return err;
  json_t *vocab = json_object_get(model, "vocab");
  if (!json_is_object(vocab))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: model.vocab: expected an object of token -> id");
  json_t *added = json_object_get(root, "added_tokens");
  if (added && !json_is_null(added) && !json_is_array(added))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: added_tokens: expected an array");
  size_t n_added = json_is_array(added) ? json_array_size(added) : 0;

  json_int_t max_id;
  if ((err = load_check_ids(vocab, added, n_added, &max_id, errstr, errstr_size)) ||
      (err = load_vocab(tok, vocab, n_added, max_id, errstr, errstr_size)) ||
      (err = load_added(tok, added, n_added, errstr, errstr_size)))
    return err;
  load_byte_tokens(tok);
  tok->unk_id = -1;
  if (unk && (tok->unk_id = strmap_get(&tok->vocab, unk, strlen(unk))) < 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: model.unk_token: \"%.40s\" is not in model.vocab", unk);
  if ((err = load_merges(tok, model, errstr, errstr_size))) return err;
  return load_pre_and_decoder(tok, root, errstr, errstr_size);
}

lt_err_t lt_tok_load_json(const char *json, size_t len, lt_tok_t **out, char *errstr,
                          size_t errstr_size) {
  *out = NULL;
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: line %d column %d: %s", jerr.line, jerr.column, jerr.text);
  lt_tok_t *tok = calloc(1, sizeof *tok);
  if (!tok) {
    json_decref(root);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
  }
  lt_err_t err = load_root(tok, root, errstr, errstr_size);
  json_decref(root);
  if (err) {
    lt_tok_destroy(tok);
    return err;
  }
  *out = tok;
  return LT_OK;
}

lt_err_t lt_tok_load_file(const char *path, lt_tok_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 1 << 20;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: out of memory", path);
      }
      buf = nb;
    }
    size_t r = fread(buf + len, 1, cap - len, f);
    len += r;
    if (r == 0) break;
  }
  int rerr = ferror(f);
  fclose(f);
  if (rerr) {
    free(buf);
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: read error", path);
  }
  char inner[400];
  lt_err_t err = lt_tok_load_json(buf, len, out, inner, sizeof inner);
  free(buf);
  if (err) return lt_errf(errstr, errstr_size, err, "%s: %s", path, inner);
  return LT_OK;
}
