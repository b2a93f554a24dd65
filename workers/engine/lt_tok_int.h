/* lt_tok_int.h: what the tokenizer's files share and nothing outside them may use.
 *
 * lt_tok_load.c parses tokenizer.json into struct lt_tok, lt_tok.c encodes and decodes with it
 * (and owns the hash maps and the pre-tokenizer), lt_tok_train.c trains a vocabulary with the
 * same pre-tokenizer and byte alphabet. This header holds the byte <-> unicode map, the hash
 * maps, the tokenizer structure and the pre-tokenizer's scratch. */
#ifndef LT_TOK_INT_H
#define LT_TOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lt_tok.h"

/* The GPT-2 split regex used by HF's ByteLevel pre-tokenizer when use_regex is true. */
#define LT_TOK_GPT2_PATTERN \
  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* ---------------------------------------------------------------- byte <-> unicode map */

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100.. in
 * byte order. */
static inline void byte_unicode_table(uint32_t cp_of_byte[256]) {
  uint32_t n = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cp_of_byte[b] = printable ? (uint32_t)b : 256 + n++;
  }
}

static inline size_t utf8_put(char *dst, uint32_t cp) {
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

/* ---------------------------------------------------------------- hash maps */

static inline uint64_t hash_bytes(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

static inline uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* Slots for `want` keys at most half full: a power of two, at least 16. */
static inline size_t map_cap(size_t want) {
  size_t cap = 16;
  while (cap < want * 2) cap <<= 1;
  return cap;
}

/* String -> int32 map; keys are borrowed (they live in the tokenizer's id table). */
typedef struct strmap {
  const char **key;
  uint32_t *klen;
  int32_t *val;
  size_t cap, n; /* cap is a power of two; 0 keys are empty slots */
} strmap_t;

int lt_tok_strmap_init(strmap_t *m, size_t want); /* 0, or -1 when out of memory */
void lt_tok_strmap_free(strmap_t *m);
/* Inserts or replaces. Returns 0, or -1 on allocation failure. */
int lt_tok_strmap_put(strmap_t *m, const char *k, size_t n, int32_t v);

static inline int32_t strmap_get(const strmap_t *m, const char *k, size_t n) {
  if (!m->cap) return -1;
  size_t i = hash_bytes(k, n) & (m->cap - 1);
  while (m->key[i]) {
    if (m->klen[i] == n && memcmp(m->key[i], k, n) == 0) return m->val[i];
    i = (i + 1) & (m->cap - 1);
  }
  return -1;
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

/* One id of the vocabulary. */
typedef struct tok_entry {
  char *str;     /* vocabulary string (or added token content), NULL if unassigned */
  uint32_t len;
  uint8_t added; /* 0 vocab, 1 added, 2 added special */
} tok_entry_t;

struct lt_tok {
  int32_t n_ids;
  tok_entry_t *entries; /* [n_ids] */
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

/* ---------------------------------------------------------------- the pre-tokenizer */

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

/* Grows *p (elements of `elem` bytes) to hold `need`, doubling. 0, or -1 when out of memory. */
int lt_tok_grow(void **p, size_t *cap, size_t need, size_t elem);
/* Appends the span (off, len) unless it is empty. 0, or -1 when out of memory. */
int lt_tok_span_push(span_t **v, size_t *n, size_t *cap, size_t off, size_t len);
/* Applies one split step to every span of s->a, leaving the result in s->a. 0, -1 when out of
 * memory, -2 when the regex failed (a PCRE2 matching limit). */
int lt_tok_apply_step(const pre_step_t *st, const char *text, scratch_t *s);
void lt_tok_scratch_free(scratch_t *s);

/* lt_tok_load.c: compiles a pre-tokenizer regex (UTF, UCP, invalid UTF-8 never matches); `path`
 * names it in messages. */
lt_err_t lt_tok_compile_regex(const char *pattern, size_t len, pcre2_code **out,
                              const char *path, char *errstr, size_t errstr_size);

#endif
