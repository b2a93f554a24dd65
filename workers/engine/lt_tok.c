/* lt_tok: byte-level BPE tokenizer (see lt_tok.h for the contract).
 *
 * Pipeline of lt_tok_encode: split the text on added tokens (leftmost-longest), then for each
 * plain segment run the pre-tokenizer steps (PCRE2 regexes compiled with UTF + UCP, so \p{L},
 * \p{N} and \s follow Unicode; invalid UTF-8 never matches and falls into the gaps, which
 * become their own pre-tokens), then BPE each pre-token: start from the byte tokens and apply
 * the lowest-ranked adjacent merge first (ties: leftmost), with a binary heap over a linked
 * list of symbols, so a long word costs O(n log n). Merges are looked up by (left id, right
 * id) in an open-addressing hash map.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "lt_tok.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The GPT-2 split regex used by HF's ByteLevel pre-tokenizer when use_regex is true. */
static const char k_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---------------------------------------------------------------- byte <-> unicode map */

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100.. in
 * byte order. */
static void byte_unicode_table(uint32_t cp_of_byte[256]) {
  uint32_t n = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cp_of_byte[b] = printable ? (uint32_t)b : 256 + n++;
  }
}

static size_t utf8_put(char *dst, uint32_t cp) {
  if (cp < 0x80) {
    dst[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    dst[0] = (char)(0xC0 | (cp >> 6));
    dst[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    dst[0] = (char)(0xE0 | (cp >> 12));
    dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  dst[0] = (char)(0xF0 | (cp >> 18));
  dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  dst[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Decodes one UTF-8 character of s[0..n); returns its length, or 0 when it is not valid. */
static size_t utf8_get(const unsigned char *s, size_t n, uint32_t *cp) {
  if (n == 0) return 0;
  unsigned c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t len;
  uint32_t v, min;
  if ((c & 0xE0) == 0xC0) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

/* ---------------------------------------------------------------- hash maps */

static uint64_t hash_bytes(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* String -> int32 map; keys are borrowed (they live in the tokenizer's id table). */
typedef struct strmap {
  const char **key;
  uint32_t *klen;
  int32_t *val;
  size_t cap, n; /* cap is a power of two; 0 keys are empty slots */
} strmap_t;

static int strmap_init(strmap_t *m, size_t want) {
  size_t cap = 16;
  while (cap < want * 2) cap <<= 1;
  m->key = calloc(cap, sizeof *m->key);
  m->klen = calloc(cap, sizeof *m->klen);
  m->val = calloc(cap, sizeof *m->val);
  m->cap = cap;
  m->n = 0;
  return m->key && m->klen && m->val ? 0 : -1;
}

static void strmap_free(strmap_t *m) {
  free(m->key);
  free(m->klen);
  free(m->val);
  memset(m, 0, sizeof *m);
}

static int32_t strmap_get(const strmap_t *m, const char *k, size_t n) {
  if (!m->cap) return -1;
  size_t i = hash_bytes(k, n) & (m->cap - 1);
  while (m->key[i]) {
    if (m->klen[i] == n && memcmp(m->key[i], k, n) == 0) return m->val[i];
    i = (i + 1) & (m->cap - 1);
  }
  return -1;
}

static int strmap_grow(strmap_t *m);

/* Inserts or replaces. Returns 0, or -1 on allocation failure. */
static int strmap_put(strmap_t *m, const char *k, size_t n, int32_t v) {
  if ((m->n + 1) * 2 > m->cap && strmap_grow(m)) return -1;
  size_t i = hash_bytes(k, n) & (m->cap - 1);
  while (m->key[i]) {
    if (m->klen[i] == n && memcmp(m->key[i], k, n) == 0) {
      m->val[i] = v;
      return 0;
    }
    i = (i + 1) & (m->cap - 1);
  }
  m->key[i] = k;
  m->klen[i] = (uint32_t)n;
  m->val[i] = v;
  m->n++;
  return 0;
}

static int strmap_grow(strmap_t *m) {
  strmap_t big;
  if (strmap_init(&big, m->cap)) {
    strmap_free(&big);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->key[i]) strmap_put(&big, m->key[i], m->klen[i], m->val[i]);
  strmap_free(m);
  *m = big;
  return 0;
}

/* (left id, right id) -> (rank, merged id). */
typedef struct pairmap {
  uint64_t *key; /* (left << 32 | right) + 1; 0 is empty */
  int32_t *rank;
  int32_t *merged;
  size_t cap;
} pairmap_t;

static inline uint64_t pair_key(int32_t a, int32_t b) {
  return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

static int pairmap_init(pairmap_t *m, size_t want) {
  size_t cap = 16;
  while (cap < want * 2) cap <<= 1;
  m->key = calloc(cap, sizeof *m->key);
  m->rank = malloc(cap * sizeof *m->rank);
  m->merged = malloc(cap * sizeof *m->merged);
  m->cap = cap;
  return m->key && m->rank && m->merged ? 0 : -1;
}

static void pairmap_free(pairmap_t *m) {
  free(m->key);
  free(m->rank);
  free(m->merged);
  memset(m, 0, sizeof *m);
}

/* Returns the slot of (a, b): holding it, or the empty slot where it would go. */
static inline size_t pairmap_slot(const pairmap_t *m, uint64_t k) {
  size_t i = hash_u64(k) & (m->cap - 1);
  while (m->key[i] && m->key[i] != k) i = (i + 1) & (m->cap - 1);
  return i;
}

/* ---------------------------------------------------------------- the tokenizer */

enum { STEP_REGEX, STEP_DIGITS };

typedef struct pre_step {
  int kind;
  pcre2_code *re;    /* STEP_REGEX */
  int removed;       /* STEP_REGEX: behavior "Removed" drops the matches */
  int individual;    /* STEP_DIGITS: one pre-token per digit */
} pre_step_t;

typedef struct added_tok {
  const char *s; /* owned by the id table */
  size_t len;
  int32_t id;
  int special, lstrip, rstrip;
} added_tok_t;

struct lt_tok {
  int32_t n_ids;
  char **str;        /* [n_ids] vocabulary string (or added token content), NULL if unassigned */
  uint32_t *len;     /* [n_ids] */
  uint8_t *added;    /* [n_ids] 0 vocab, 1 added, 2 added special */
  strmap_t vocab;    /* string -> id, vocabulary and added tokens */
  pairmap_t merges;
  int32_t byte_id[256];      /* id of each byte's token, -1 if missing */
  uint32_t cp_of_byte[256];  /* bytes_to_unicode */
  int16_t byte_of_cp[324];   /* inverse, -1 elsewhere */
  added_tok_t *added_list;   /* sorted longest first */
  size_t n_added;
  uint8_t added_first[256];  /* 1 if some added token starts with this byte */
  pre_step_t *steps;
  size_t n_steps;
  int add_prefix_space;
  int ignore_merges;
  int32_t unk_id;
};

void lt_tok_seq_init(lt_tok_seq_t *seq) { memset(seq, 0, sizeof *seq); }

void lt_tok_seq_free(lt_tok_seq_t *seq) {
  if (!seq) return;
  free(seq->ids);
  free(seq->weights);
  memset(seq, 0, sizeof *seq);
}

static int seq_push(lt_tok_seq_t *seq, int32_t id, float w) {
  if (seq->len == seq->cap) {
    size_t cap = seq->cap ? seq->cap * 2 : 256;
    int32_t *ids = realloc(seq->ids, cap * sizeof *ids);
    if (!ids) return -1;
    seq->ids = ids;
    float *ws = realloc(seq->weights, cap * sizeof *ws);
    if (!ws) return -1;
    seq->weights = ws;
    seq->cap = cap;
  }
  seq->ids[seq->len] = id;
  seq->weights[seq->len] = w;
  seq->len++;
  return 0;
}

void lt_tok_free(lt_tok_t *tok) {
  if (!tok) return;
  if (tok->str)
    for (int32_t i = 0; i < tok->n_ids; i++) free(tok->str[i]);
  free(tok->str);
  free(tok->len);
  free(tok->added);
  strmap_free(&tok->vocab);
  pairmap_free(&tok->merges);
  free(tok->added_list);
  for (size_t i = 0; i < tok->n_steps; i++) pcre2_code_free(tok->steps[i].re);
  free(tok->steps);
  free(tok);
}

int32_t lt_tok_vocab_size(const lt_tok_t *tok) { return tok->n_ids; }

int32_t lt_tok_token_id(const lt_tok_t *tok, const char *token) {
  return strmap_get(&tok->vocab, token, strlen(token));
}

const char *lt_tok_token_str(const lt_tok_t *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids ? tok->str[id] : NULL;
}

int lt_tok_is_special(const lt_tok_t *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids && tok->added[id] == 2;
}

int32_t lt_tok_eos_id(const lt_tok_t *tok) {
  static const char *const names[] = {"<|endoftext|>", "</s>", "<|im_end|>"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int32_t id = lt_tok_token_id(tok, names[i]);
    if (id >= 0) return id;
  }
  return -1;
}

/* ---------------------------------------------------------------- loading */

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

static lt_err_t compile_regex(const char *pattern, size_t len, pcre2_code **out, const char *path,
                              char *errstr, size_t errstr_size) {
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
      if ((err = compile_regex(k_gpt2_pattern, sizeof k_gpt2_pattern - 1, &st.re, sub, errstr,
                               errstr_size)))
        return err;
      return add_step(tok, st, errstr, errstr_size);
    }
    return LT_OK;
  }
  if (strcmp(type, "Split") == 0) {
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
      if ((err = compile_regex(json_string_value(rx), json_string_length(rx), &st.re, sub, errstr,
                               errstr_size)))
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
      err = compile_regex(q, n + 4, &st.re, sub, errstr, errstr_size);
      free(q);
      if (err) return err;
    }
    return add_step(tok, st, errstr, errstr_size);
  }
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
  const char *mtype;
  if ((err = opt_string(model, "type", "model", &mtype, errstr, errstr_size))) return err;
  if (!mtype || strcmp(mtype, "BPE") != 0)
    return lt_errf(errstr, errstr_size, mtype ? LT_ERR_UNSUPPORTED : LT_ERR_INVALID,
                   "tokenizer.json: model.type: expected \"BPE\", got %s%s%s", mtype ? "\"" : "",
                   mtype ? mtype : "nothing", mtype ? "\"" : "");
  int byte_fallback, fuse_unk;
  const char *csp, *ews, *unk;
  if ((err = opt_bool(model, "byte_fallback", "model", 0, &byte_fallback, errstr, errstr_size)) ||
      (err = opt_bool(model, "fuse_unk", "model", 0, &fuse_unk, errstr, errstr_size)) ||
      (err = opt_bool(model, "ignore_merges", "model", 0, &tok->ignore_merges, errstr,
                      errstr_size)) ||
      (err = opt_string(model, "continuing_subword_prefix", "model", &csp, errstr,
                        errstr_size)) ||
      (err = opt_string(model, "end_of_word_suffix", "model", &ews, errstr, errstr_size)) ||
      (err = opt_string(model, "unk_token", "model", &unk, errstr, errstr_size)))
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

  json_t *vocab = json_object_get(model, "vocab");
  if (!json_is_object(vocab))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: model.vocab: expected an object of token -> id");
  json_t *added = json_object_get(root, "added_tokens");
  if (added && !json_is_null(added) && !json_is_array(added))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: added_tokens: expected an array");
  size_t n_added = json_is_array(added) ? json_array_size(added) : 0;

  /* Size the id table: one past the largest id anywhere. */
  json_int_t max_id = -1;
  const char *key;
  json_t *val;
  json_object_foreach(vocab, key, val) {
    if (!json_is_integer(val) || json_integer_value(val) < 0 ||
        json_integer_value(val) >= (1 << 24))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: model.vocab[\"%.40s\"]: expected an integer id in "
                     "[0, 16777216)",
                     key);
    if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
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
    if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
  }
  if (max_id < 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: model.vocab: expected at least one token");

  tok->n_ids = (int32_t)max_id + 1;
  tok->str = calloc((size_t)tok->n_ids, sizeof *tok->str);
  tok->len = calloc((size_t)tok->n_ids, sizeof *tok->len);
  tok->added = calloc((size_t)tok->n_ids, 1);
  if (!tok->str || !tok->len || !tok->added ||
      strmap_init(&tok->vocab, json_object_size(vocab) + n_added))
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");

  json_object_foreach(vocab, key, val) {
    int32_t id = (int32_t)json_integer_value(val);
    size_t n = strlen(key);
    if (tok->str[id])
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: model.vocab[\"%.40s\"]: id %d is already used by "
                     "\"%.40s\"",
                     key, id, tok->str[id]);
    if (!(tok->str[id] = strdup(key)))
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
    tok->len[id] = (uint32_t)n;
    if (strmap_put(&tok->vocab, tok->str[id], n, id))
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
  }

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
    if ((err = opt_bool(a, "special", path, 0, &at->special, errstr, errstr_size)) ||
        (err = opt_bool(a, "lstrip", path, 0, &at->lstrip, errstr, errstr_size)) ||
        (err = opt_bool(a, "rstrip", path, 0, &at->rstrip, errstr, errstr_size)))
      return err;
    if (tok->str[id] && (tok->len[id] != n || memcmp(tok->str[id], s, n) != 0))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "tokenizer.json: %s.id: id %d is already the vocabulary token \"%.40s\"",
                     path, id, tok->str[id]);
    if (!tok->str[id]) {
      if (!(tok->str[id] = malloc(n + 1)))
        return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
      memcpy(tok->str[id], s, n + 1);
      tok->len[id] = (uint32_t)n;
    }
    if (strmap_put(&tok->vocab, tok->str[id], n, id))
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
    tok->added[id] = at->special ? 2 : 1;
    at->s = tok->str[id];
    at->len = n;
    at->id = id;
    tok->added_first[(unsigned char)s[0]] = 1;
    tok->n_added++;
  }
  qsort(tok->added_list, tok->n_added, sizeof *tok->added_list, cmp_added_len);

  /* Byte tokens. */
  byte_unicode_table(tok->cp_of_byte);
  memset(tok->byte_of_cp, 0xff, sizeof tok->byte_of_cp);
  for (int b = 0; b < 256; b++) {
    char u[4];
    size_t n = utf8_put(u, tok->cp_of_byte[b]);
    tok->byte_id[b] = strmap_get(&tok->vocab, u, n);
    tok->byte_of_cp[tok->cp_of_byte[b]] = (int16_t)b;
  }

  tok->unk_id = -1;
  if (unk && (tok->unk_id = strmap_get(&tok->vocab, unk, strlen(unk))) < 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer.json: model.unk_token: \"%.40s\" is not in model.vocab", unk);

  /* Merges. */
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
      goto merges_done;
    int32_t ia = strmap_get(&tok->vocab, a, alen), ib = strmap_get(&tok->vocab, b, blen);
    if (alen + blen + 1 > buf_cap) {
      buf_cap = (alen + blen + 1) * 2;
      char *nb = realloc(buf, buf_cap);
      if (!nb) {
        err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer.json: out of memory");
        goto merges_done;
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
      goto merges_done;
    }
    uint64_t k = pair_key(ia, ib);
    size_t slot = pairmap_slot(&tok->merges, k);
    if (!tok->merges.key[slot]) { /* the first (lowest-ranked) occurrence wins */
      tok->merges.key[slot] = k;
      tok->merges.rank[slot] = (int32_t)i;
      tok->merges.merged[slot] = im;
    }
  }
merges_done:
  free(buf);
  if (err) return err;

  /* Pre-tokenizer: ByteLevel is required (it is what makes this byte-level BPE). */
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
    lt_tok_free(tok);
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

/* ---------------------------------------------------------------- encoding */

typedef struct span {
  size_t off, len;
} span_t;

typedef struct sym {
  int32_t id;
  int32_t prev, next;
  uint32_t len; /* 0 once merged into its left neighbour */
} sym_t;

typedef struct hent {
  int32_t rank;
  int32_t pos;
  int32_t merged;
} hent_t;

/* Per-call scratch: everything encode needs, grown on demand and freed at the end. */
typedef struct scratch {
  span_t *a, *b;
  size_t a_n, a_cap, b_n, b_cap;
  sym_t *sym;
  size_t sym_cap;
  hent_t *heap;
  size_t heap_cap;
  char *text; /* prefixed segment, or byte-level form for ignore_merges */
  size_t text_cap;
  pcre2_match_data *md;
} scratch_t;

static void scratch_free(scratch_t *s) {
  free(s->a);
  free(s->b);
  free(s->sym);
  free(s->heap);
  free(s->text);
  if (s->md) pcre2_match_data_free(s->md);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *np = realloc(*p, c * elem);
  if (!np) return -1;
  *p = np;
  *cap = c;
  return 0;
}

static int span_push(span_t **v, size_t *n, size_t *cap, size_t off, size_t len) {
  if (len == 0) return 0;
  if (grow((void **)v, cap, *n + 1, sizeof **v)) return -1;
  (*v)[*n].off = off;
  (*v)[*n].len = len;
  (*n)++;
  return 0;
}

static inline int heap_less(const hent_t *x, const hent_t *y) {
  return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(hent_t *h, size_t *n, hent_t e) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(&e, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = e;
}

static hent_t heap_pop(hent_t *h, size_t *n) {
  hent_t top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const hent_t *best = &last;
    if (l < *n && heap_less(&h[l], best)) m = l, best = &h[l];
    if (r < *n && heap_less(&h[r], best)) m = r;
    if (m == i) break;
    h[i] = h[m];
    i = m;
  }
  if (*n) h[i] = last;
  return top;
}

static inline int lookup_merge(const lt_tok_t *tok, int32_t a, int32_t b, int32_t *rank,
                               int32_t *merged) {
  if (a < 0 || b < 0) return 0;
  const pairmap_t *m = &tok->merges;
  size_t slot = pairmap_slot(m, pair_key(a, b));
  if (!m->key[slot]) return 0;
  *rank = m->rank[slot];
  *merged = m->merged[slot];
  return 1;
}

/* BPE of one pre-token; appends its ids to seq. */
static int bpe_word(const lt_tok_t *tok, scratch_t *s, const unsigned char *w, size_t n,
                    float weight, lt_tok_seq_t *seq) {
  if (n == 1) {
    int32_t id = tok->byte_id[w[0]];
    if (id < 0) id = tok->unk_id;
    return id >= 0 ? seq_push(seq, id, weight) : 0;
  }
  if (tok->ignore_merges) {
    if (grow((void **)&s->text, &s->text_cap, n * 2, 1)) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += utf8_put(s->text + k, tok->cp_of_byte[w[i]]);
    int32_t id = strmap_get(&tok->vocab, s->text, k);
    if (id >= 0 && !tok->added[id]) return seq_push(seq, id, weight);
  }
  if (grow((void **)&s->sym, &s->sym_cap, n, sizeof *s->sym) ||
      grow((void **)&s->heap, &s->heap_cap, 2 * n + 2, sizeof *s->heap))
    return -1;
  sym_t *sym = s->sym;
  for (size_t i = 0; i < n; i++) {
    sym[i].id = tok->byte_id[w[i]];
    sym[i].prev = (int32_t)i - 1;
    sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    sym[i].len = 1;
  }
  size_t hn = 0;
  for (size_t i = 0; i + 1 < n; i++) {
    hent_t e = {.pos = (int32_t)i};
    if (lookup_merge(tok, sym[i].id, sym[i + 1].id, &e.rank, &e.merged))
      heap_push(s->heap, &hn, e);
  }
  while (hn) {
    hent_t e = heap_pop(s->heap, &hn);
    sym_t *x = &sym[e.pos];
    if (x->len == 0 || x->next < 0) continue;
    sym_t *y = &sym[x->next];
    int32_t rank, merged;
    if (!lookup_merge(tok, x->id, y->id, &rank, &merged) || rank != e.rank) continue;
    x->id = merged;
    x->len += y->len;
    y->len = 0;
    x->next = y->next;
    if (x->next >= 0) sym[x->next].prev = e.pos;
    /* Every merge removes one symbol and adds at most two heap entries, so 2n bounds it. */
    if (x->prev >= 0) {
      hent_t p = {.pos = x->prev};
      if (lookup_merge(tok, sym[x->prev].id, x->id, &p.rank, &p.merged))
        heap_push(s->heap, &hn, p);
    }
    if (x->next >= 0) {
      hent_t q = {.pos = e.pos};
      if (lookup_merge(tok, x->id, sym[x->next].id, &q.rank, &q.merged))
        heap_push(s->heap, &hn, q);
    }
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    int32_t id = sym[i].id >= 0 ? sym[i].id : tok->unk_id;
    if (id >= 0 && seq_push(seq, id, weight)) return -1;
  }
  return 0;
}

/* Applies one split step to every span of s->a, writing s->b, then swaps. */
static int apply_step(const pre_step_t *st, const char *text, scratch_t *s) {
  s->b_n = 0;
  for (size_t k = 0; k < s->a_n; k++) {
    size_t off = s->a[k].off, end = off + s->a[k].len;
    if (st->kind == STEP_DIGITS) {
      size_t i = off;
      while (i < end) {
        int digit = text[i] >= '0' && text[i] <= '9';
        size_t j = i + 1;
        if (!(digit && st->individual))
          while (j < end && ((text[j] >= '0' && text[j] <= '9') == digit)) j++;
        if (span_push(&s->b, &s->b_n, &s->b_cap, i, j - i)) return -1;
        i = j;
      }
      continue;
    }
    size_t pos = off;
    while (pos < end) {
      int rc = pcre2_match(st->re, (PCRE2_SPTR)text, end, pos, 0, s->md, NULL);
      if (rc == PCRE2_ERROR_NOMATCH) break; /* the rest is one gap */
      if (rc < 0) return -2;                /* a matching limit: never split silently */
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
      size_t ms = ov[0], me = ov[1];
      if (me == ms) { /* empty match: step over one byte so we always progress */
        if (ms >= end) break;
        me = ms + 1;
        while (me < end && ((unsigned char)text[me] & 0xC0) == 0x80) me++;
        if (span_push(&s->b, &s->b_n, &s->b_cap, pos, me - pos)) return -1;
        pos = me;
        continue;
      }
      if (span_push(&s->b, &s->b_n, &s->b_cap, pos, ms - pos)) return -1;
      if (!st->removed && span_push(&s->b, &s->b_n, &s->b_cap, ms, me - ms)) return -1;
      pos = me;
    }
    if (pos < end && span_push(&s->b, &s->b_n, &s->b_cap, pos, end - pos)) return -1;
  }
  span_t *t = s->a;
  s->a = s->b;
  s->b = t;
  size_t tc = s->a_cap;
  s->a_cap = s->b_cap;
  s->b_cap = tc;
  s->a_n = s->b_n;
  return 0;
}

static int encode_segment(const lt_tok_t *tok, scratch_t *s, const char *text, size_t len,
                          float weight, lt_tok_seq_t *seq) {
  if (len == 0) return 0;
  char *copy = NULL;
  if (tok->add_prefix_space && text[0] != ' ') { /* HF adds the space per segment */
    if (!(copy = malloc(len + 1))) return -1;
    copy[0] = ' ';
    memcpy(copy + 1, text, len);
    text = copy;
    len++;
  }
  s->a_n = 0;
  int r = span_push(&s->a, &s->a_n, &s->a_cap, 0, len);
  for (size_t i = 0; !r && i < tok->n_steps; i++) r = apply_step(&tok->steps[i], text, s);
  for (size_t i = 0; !r && i < s->a_n; i++)
    r = bpe_word(tok, s, (const unsigned char *)text + s->a[i].off, s->a[i].len, weight, seq);
  free(copy);
  return r;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Leftmost-longest added token starting at text[i], or NULL. */
static const added_tok_t *added_at(const lt_tok_t *tok, const char *text, size_t len, size_t i,
                                   int flags) {
  if (!tok->added_first[(unsigned char)text[i]]) return NULL;
  for (size_t k = 0; k < tok->n_added; k++) {
    const added_tok_t *a = &tok->added_list[k];
    if (a->special && !(flags & LT_TOK_SPECIAL)) continue;
    if (a->len <= len - i && memcmp(text + i, a->s, a->len) == 0) return a;
  }
  return NULL;
}

lt_err_t lt_tok_encode(const lt_tok_t *tok, const char *text, size_t len, int flags, float weight,
                       lt_tok_seq_t *seq, char *errstr, size_t errstr_size) {
  scratch_t s = {0};
  int r = 0;
  if (tok->n_steps) {
    s.md = pcre2_match_data_create(4, NULL);
    if (!s.md) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer: out of memory");
  }
  size_t seg = 0, i = 0;
  int strip_next = 0;
  while (i < len && !r) {
    const added_tok_t *a = tok->n_added ? added_at(tok, text, len, i, flags) : NULL;
    if (!a) {
      i++;
      continue;
    }
    size_t seg_end = i;
    if (strip_next)
      while (seg < seg_end && is_ws(text[seg])) seg++;
    if (a->lstrip)
      while (seg_end > seg && is_ws(text[seg_end - 1])) seg_end--;
    r = encode_segment(tok, &s, text + seg, seg_end - seg, weight, seq);
    if (!r) r = seq_push(seq, a->id, weight);
    i += a->len;
    seg = i;
    strip_next = a->rstrip;
  }
  if (!r) {
    if (strip_next)
      while (seg < len && is_ws(text[seg])) seg++;
    r = encode_segment(tok, &s, text + seg, len - seg, weight, seq);
  }
  scratch_free(&s);
  if (r == -2)
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL,
                   "tokenizer: the pre-tokenizer regex failed (a PCRE2 matching limit)");
  return r ? lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "tokenizer: out of memory") : LT_OK;
}

/* ---------------------------------------------------------------- decoding */

lt_err_t lt_tok_decode(const lt_tok_t *tok, const int32_t *ids, size_t n, int skip_special,
                       char **out, size_t *out_len, char *errstr, size_t errstr_size) {
  *out = NULL;
  *out_len = 0;
  size_t cap = 1;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= tok->n_ids || !tok->str[ids[i]])
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "decode: ids[%zu] = %d is not a token of this tokenizer (vocab size %d)", i,
                     ids[i], tok->n_ids);
    cap += tok->len[ids[i]];
  }
  char *buf = malloc(cap);
  if (!buf) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "decode: out of memory");
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    const unsigned char *s = (const unsigned char *)tok->str[id];
    size_t len = tok->len[id];
    if (tok->added[id]) {
      if (tok->added[id] == 2 && skip_special) continue;
      memcpy(buf + k, s, len);
      k += len;
      continue;
    }
    size_t j = 0;
    while (j < len) {
      uint32_t cp;
      size_t cl = utf8_get(s + j, len - j, &cp);
      if (cl == 0) { /* not UTF-8: copy the byte as is */
        buf[k++] = (char)s[j++];
        continue;
      }
      if (cp < 324 && tok->byte_of_cp[cp] >= 0) {
        buf[k++] = (char)tok->byte_of_cp[cp];
      } else { /* a character outside the byte alphabet: keep its UTF-8 */
        memcpy(buf + k, s + j, cl);
        k += cl;
      }
      j += cl;
    }
  }
  buf[k] = '\0';
  *out = buf;
  *out_len = k;
  return LT_OK;
}

/* ---------------------------------------------------------------- templates */

static int32_t need_token(const lt_tok_t *tok, const char *name, char *errstr,
                          size_t errstr_size, lt_err_t *err) {
  int32_t id = lt_tok_token_id(tok, name);
  if (id < 0)
    *err = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "chat template: the tokenizer has no %s token", name);
  return id;
}

lt_err_t lt_tok_encode_chat(const lt_tok_t *tok, const lt_tok_msg_t *msgs, size_t n,
                            int add_generation_prompt, lt_tok_seq_t *seq, char *errstr,
                            size_t errstr_size) {
  lt_err_t err = LT_OK;
  int32_t start = need_token(tok, "<|im_start|>", errstr, errstr_size, &err);
  if (err) return err;
  int32_t end = need_token(tok, "<|im_end|>", errstr, errstr_size, &err);
  if (err) return err;
  for (size_t i = 0; i < n; i++) {
    const char *role = msgs[i].role;
    if (!role || !*role)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "messages[%zu].role: expected a non-empty role such as \"user\"", i);
    for (const char *p = role; *p; p++)
      if (!((*p >= 'a' && *p <= 'z') || *p == '_'))
        return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                       "messages[%zu].role: expected lowercase letters and '_', got \"%.40s\"", i,
                       role);
  }
  for (size_t i = 0; i < n && !err; i++) {
    float w = strcmp(msgs[i].role, "assistant") == 0 ? 1.0f : 0.0f;
    if (seq_push(seq, start, 0)) goto nomem;
    if ((err = lt_tok_encode(tok, msgs[i].role, strlen(msgs[i].role), 0, 0, seq, errstr,
                             errstr_size)) ||
        (err = lt_tok_encode(tok, "\n", 1, 0, 0, seq, errstr, errstr_size)) ||
        (err = lt_tok_encode(tok, msgs[i].content, msgs[i].content_len, 0, w, seq, errstr,
                             errstr_size)))
      return err;
    if (seq_push(seq, end, w)) goto nomem;
    if ((err = lt_tok_encode(tok, "\n", 1, 0, 0, seq, errstr, errstr_size))) return err;
  }
  if (add_generation_prompt) {
    if (seq_push(seq, start, 0)) goto nomem;
    if ((err = lt_tok_encode(tok, "assistant\n", 10, 0, 0, seq, errstr, errstr_size))) return err;
  }
  return err;
nomem:
  return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "chat template: out of memory");
}

lt_err_t lt_tok_encode_prompt_completion(const lt_tok_t *tok, const char *prompt,
                                         size_t prompt_len, const char *completion,
                                         size_t completion_len, lt_tok_seq_t *seq,
                                         char *errstr, size_t errstr_size) {
  lt_err_t err;
  if ((err = lt_tok_encode(tok, prompt, prompt_len, 0, 0, seq, errstr, errstr_size)) ||
      (err = lt_tok_encode(tok, completion, completion_len, 0, 1, seq, errstr, errstr_size)))
    return err;
  int32_t eos = lt_tok_eos_id(tok);
  if (eos >= 0 && seq_push(seq, eos, 1))
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "prompt/completion: out of memory");
  return LT_OK;
}

lt_err_t lt_tok_encode_json_line(const lt_tok_t *tok, const char *line, size_t len,
                                 lt_tok_seq_t *seq, char *errstr, size_t errstr_size) {
  json_error_t jerr;
  json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "column %d: not valid JSON: %s",
                   jerr.column, jerr.text);
  lt_err_t err = LT_OK;
  lt_tok_msg_t *msgs = NULL;
  json_t *m = json_object_get(root, "messages");
  json_t *p = json_object_get(root, "prompt"), *c = json_object_get(root, "completion");
  if (!json_is_object(root)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "expected a JSON object");
  } else if (m) {
    if (!json_is_array(m) || json_array_size(m) == 0) {
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                    "messages: expected a non-empty array of {\"role\",\"content\"}");
      goto out;
    }
    size_t n = json_array_size(m);
    if (!(msgs = calloc(n, sizeof *msgs))) {
      err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
      goto out;
    }
    for (size_t i = 0; i < n; i++) {
      json_t *o = json_array_get(m, i);
      json_t *role = json_object_get(o, "role"), *content = json_object_get(o, "content");
      if (!json_is_object(o)) {
        err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "messages[%zu]: expected an object", i);
        goto out;
      }
      if (!json_is_string(role)) {
        err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "messages[%zu].role: expected a string",
                      i);
        goto out;
      }
      if (!json_is_string(content)) {
        err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                      "messages[%zu].content: expected a string", i);
        goto out;
      }
      msgs[i].role = json_string_value(role);
      msgs[i].content = json_string_value(content);
      msgs[i].content_len = json_string_length(content);
    }
    err = lt_tok_encode_chat(tok, msgs, n, 0, seq, errstr, errstr_size);
  } else if (p || c) {
    if (!json_is_string(p))
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "prompt: expected a string");
    else if (!json_is_string(c))
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "completion: expected a string");
    else
      err = lt_tok_encode_prompt_completion(tok, json_string_value(p), json_string_length(p),
                                            json_string_value(c), json_string_length(c), seq,
                                            errstr, errstr_size);
  } else {
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                  "expected a \"messages\" array or \"prompt\" and \"completion\" strings");
  }
out:
  free(msgs);
  json_decref(root);
  return err;
}

/* ---------------------------------------------------------------- training */

/* (left id, right id) -> occurrence count, for the trainer. */
typedef struct paircount {
  uint64_t *key; /* pair_key(); 0 is empty */
  int64_t *count;
  size_t cap, n;
} paircount_t;

static int paircount_add(paircount_t *m, int32_t a, int32_t b, int64_t d);

static int paircount_grow(paircount_t *m) {
  paircount_t big = {0};
  big.cap = m->cap ? m->cap * 2 : 1 << 14;
  big.key = calloc(big.cap, sizeof *big.key);
  big.count = calloc(big.cap, sizeof *big.count);
  if (!big.key || !big.count) {
    free(big.key);
    free(big.count);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->key[i] && m->count[i] > 0) {
      size_t j = hash_u64(m->key[i]) & (big.cap - 1);
      while (big.key[j]) j = (j + 1) & (big.cap - 1);
      big.key[j] = m->key[i];
      big.count[j] = m->count[i];
      big.n++;
    }
  free(m->key);
  free(m->count);
  *m = big;
  return 0;
}

static int paircount_add(paircount_t *m, int32_t a, int32_t b, int64_t d) {
  if ((m->n + 1) * 2 > m->cap && paircount_grow(m)) return -1;
  uint64_t k = pair_key(a, b);
  size_t i = hash_u64(k) & (m->cap - 1);
  while (m->key[i] && m->key[i] != k) i = (i + 1) & (m->cap - 1);
  if (!m->key[i]) {
    m->key[i] = k;
    m->n++;
  }
  m->count[i] += d;
  return 0;
}

typedef struct tword {
  int32_t *sym;
  int32_t n;
  int64_t count;
} tword_t;

static int word_pairs(paircount_t *pc, const tword_t *w, int64_t sign) {
  for (int32_t i = 0; i + 1 < w->n; i++)
    if (paircount_add(pc, w->sym[i], w->sym[i + 1], sign * w->count)) return -1;
  return 0;
}

lt_err_t lt_tok_train(const char *text, size_t len, int32_t vocab_size,
                      const char *const *specials, size_t n_special, char **json_out,
                      char *errstr, size_t errstr_size) {
  *json_out = NULL;
  if (vocab_size < (int32_t)n_special + 256)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "train: vocab_size %d is below the %zu special tokens + 256 byte tokens",
                   vocab_size, n_special);
  for (size_t i = 0; i < n_special; i++)
    if (!specials[i] || !*specials[i])
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "train: specials[%zu]: expected a non-empty string", i);
  lt_err_t err = LT_OK;
  scratch_t s = {0};
  strmap_t words_by_text = {0};
  tword_t *words = NULL;
  size_t n_words = 0, words_cap = 0;
  paircount_t pc = {0};
  char **vstr = NULL;
  int32_t n_v = 0;
  strmap_t vmap = {0};
  int32_t (*merges)[2] = NULL;
  size_t n_merges = 0;
  json_t *root = NULL;
  pre_step_t st = {.kind = STEP_REGEX};

  if ((err = compile_regex(k_gpt2_pattern, sizeof k_gpt2_pattern - 1, &st.re, "train", errstr,
                           errstr_size)))
    return err;
  if (!(s.md = pcre2_match_data_create(4, NULL)) || strmap_init(&words_by_text, 1 << 14) ||
      strmap_init(&vmap, (size_t)vocab_size) || !(vstr = calloc((size_t)vocab_size, sizeof *vstr)) ||
      !(merges = calloc((size_t)vocab_size, sizeof *merges)))
    goto nomem;

  /* Count words, skipping the special tokens written in the text. */
  size_t seg = 0;
  for (size_t i = 0; i <= len; i++) {
    size_t sl = 0;
    if (i < len)
      for (size_t k = 0; k < n_special; k++) {
        size_t n = strlen(specials[k]);
        if (n <= len - i && memcmp(text + i, specials[k], n) == 0) {
          sl = n;
          break;
        }
      }
    if (i < len && !sl) continue;
    s.a_n = 0;
    if (span_push(&s.a, &s.a_n, &s.a_cap, seg, i - seg) || apply_step(&st, text, &s)) goto nomem;
    for (size_t k = 0; k < s.a_n; k++) {
      const char *w = text + s.a[k].off;
      size_t wn = s.a[k].len;
      int32_t idx = strmap_get(&words_by_text, w, wn);
      if (idx < 0) {
        if (grow((void **)&words, &words_cap, n_words + 1, sizeof *words)) goto nomem;
        tword_t *tw = &words[n_words];
        if (!(tw->sym = malloc(wn * sizeof *tw->sym))) goto nomem;
        for (size_t j = 0; j < wn; j++)
          tw->sym[j] = (int32_t)n_special + (unsigned char)w[j];
        tw->n = (int32_t)wn;
        tw->count = 0;
        idx = (int32_t)n_words++;
        if (strmap_put(&words_by_text, w, wn, idx)) goto nomem;
      }
      words[idx].count++;
    }
    seg = i + sl;
    if (sl) i += sl - 1;
  }

  /* Initial vocabulary: specials, then the 256 bytes in byte order. */
  uint32_t cp_of_byte[256];
  byte_unicode_table(cp_of_byte);
  for (size_t i = 0; i < n_special; i++)
    if (!(vstr[n_v++] = strdup(specials[i]))) goto nomem;
  for (int b = 0; b < 256; b++) {
    char u[5] = {0};
    utf8_put(u, cp_of_byte[b]);
    if (!(vstr[n_v] = strdup(u)) || strmap_put(&vmap, vstr[n_v], strlen(u), n_v)) goto nomem;
    n_v++;
  }
  for (size_t i = 0; i < n_words; i++)
    if (word_pairs(&pc, &words[i], 1)) goto nomem;

  while (n_v < vocab_size) {
    int64_t best = 0;
    uint64_t best_key = 0; /* a pair must occur at least twice; ties: smallest (left, right) */
    for (size_t i = 0; i < pc.cap; i++)
      if (pc.key[i] && pc.count[i] >= 2 &&
          (pc.count[i] > best || (pc.count[i] == best && pc.key[i] < best_key)))
        best = pc.count[i], best_key = pc.key[i];
    if (!best_key) break;
    int32_t a = (int32_t)((best_key - 1) >> 32), b = (int32_t)((best_key - 1) & 0xffffffffu);
    size_t la = strlen(vstr[a]), lb = strlen(vstr[b]);
    char *ns = malloc(la + lb + 1);
    if (!ns) goto nomem;
    memcpy(ns, vstr[a], la);
    memcpy(ns + la, vstr[b], lb + 1);
    int32_t id = strmap_get(&vmap, ns, la + lb);
    if (id < 0) {
      id = n_v;
      vstr[n_v++] = ns;
      if (strmap_put(&vmap, ns, la + lb, id)) goto nomem;
    } else {
      free(ns);
    }
    merges[n_merges][0] = a;
    merges[n_merges][1] = b;
    n_merges++;
    for (size_t i = 0; i < n_words; i++) {
      tword_t *w = &words[i];
      int32_t j = 0;
      while (j + 1 < w->n && !(w->sym[j] == a && w->sym[j + 1] == b)) j++;
      if (j + 1 >= w->n) continue;
      if (word_pairs(&pc, w, -1)) goto nomem;
      int32_t o = 0;
      for (int32_t r = 0; r < w->n;) {
        if (r + 1 < w->n && w->sym[r] == a && w->sym[r + 1] == b) {
          w->sym[o++] = id;
          r += 2;
        } else {
          w->sym[o++] = w->sym[r++];
        }
      }
      w->n = o;
      if (word_pairs(&pc, w, 1)) goto nomem;
    }
  }

  /* The tokenizer.json. */
  root = json_object();
  json_t *added = json_array(), *vocab = json_object(), *jm = json_array();
  json_t *model = json_object();
  if (!root || !added || !vocab || !jm || !model) goto nomem_json;
  for (size_t i = 0; i < n_special; i++) {
    json_t *t = json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content",
                          specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized",
                          0, "special", 1);
    if (!t || json_array_append_new(added, t)) goto nomem_json;
  }
  for (int32_t i = 0; i < n_v; i++)
    if (json_object_set_new(vocab, vstr[i], json_integer(i))) goto nomem_json;
  for (size_t i = 0; i < n_merges; i++) {
    json_t *pair = json_pack("[s, s]", vstr[merges[i][0]], vstr[merges[i][1]]);
    if (!pair || json_array_append_new(jm, pair)) goto nomem_json;
  }
  json_object_set_new(root, "version", json_string("1.0"));
  json_object_set_new(root, "truncation", json_null());
  json_object_set_new(root, "padding", json_null());
  json_object_set_new(root, "added_tokens", added);
  json_object_set_new(root, "normalizer", json_null());
  json_object_set_new(root, "pre_tokenizer",
                      json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                "trim_offsets", 1, "use_regex", 1));
  json_object_set_new(root, "post_processor",
                      json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                "trim_offsets", 0, "use_regex", 1));
  json_object_set_new(root, "decoder",
                      json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                "trim_offsets", 1, "use_regex", 1));
  json_object_set_new(model, "type", json_string("BPE"));
  json_object_set_new(model, "dropout", json_null());
  json_object_set_new(model, "unk_token", json_null());
  json_object_set_new(model, "continuing_subword_prefix", json_null());
  json_object_set_new(model, "end_of_word_suffix", json_null());
  json_object_set_new(model, "fuse_unk", json_false());
  json_object_set_new(model, "byte_fallback", json_false());
  json_object_set_new(model, "ignore_merges", json_false());
  json_object_set_new(model, "vocab", vocab);
  json_object_set_new(model, "merges", jm);
  json_object_set_new(root, "model", model);
  added = vocab = jm = model = NULL;
  if (!(*json_out = json_dumps(root, JSON_PRESERVE_ORDER | JSON_INDENT(1) | JSON_ENSURE_ASCII)))
    goto nomem;
  goto done;

nomem_json:
  json_decref(added);
  json_decref(vocab);
  json_decref(jm);
  json_decref(model);
nomem:
  err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "train: out of memory");
done:
  json_decref(root);
  pcre2_code_free(st.re);
  scratch_free(&s);
  strmap_free(&words_by_text);
  strmap_free(&vmap);
  for (size_t i = 0; i < n_words; i++) free(words[i].sym);
  free(words);
  free(pc.key);
  free(pc.count);
  if (vstr)
    for (int32_t i = 0; i < vocab_size; i++) free(vstr[i]);
  free(vstr);
  free(merges);
  return err;
}
