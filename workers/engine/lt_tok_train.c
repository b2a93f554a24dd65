/* lt_tok_train: trains a small byte-level BPE vocabulary, deterministically (the bundled base
 * model's tokenizer). Words are the GPT-2 pre-tokenizer's pieces of the text between special
 * tokens, counted once each; the vocabulary starts with the specials and the 256 byte tokens,
 * then each round merges the most frequent adjacent pair (ties: the smallest (left, right)
 * ids) until vocab_size or until no pair occurs twice. The result is a tokenizer.json that
 * lt_tok_load_json reads back. */
#include <jansson.h>

#include "lt_tok_int.h"

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

/* The trainer's state between phases. */
typedef struct trainer {
  scratch_t s;
  pre_step_t st;            /* the GPT-2 split */
  strmap_t words_by_text;   /* word text -> index in words */
  tword_t *words;
  size_t n_words, words_cap;
  paircount_t pc;           /* adjacent pairs over all words, weighted by word count */
  char **vstr;              /* [vocab_size] token strings (byte-level form) */
  int32_t n_v, vocab_size;
  strmap_t vmap;            /* token string -> id */
  int32_t (*merges)[2];     /* [vocab_size] (left, right) in merge order */
  size_t n_merges;
} trainer_t;

/* Counts words, skipping the special tokens written in the text. 0, or -1 when out of memory. */
static int train_count_words(trainer_t *tr, const char *text, size_t len,
                             const char *const *specials, size_t n_special) {
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
    tr->s.a_n = 0;
    if (lt_tok_span_push(&tr->s.a, &tr->s.a_n, &tr->s.a_cap, seg, i - seg) ||
        lt_tok_apply_step(&tr->st, text, &tr->s))
      return -1;
    for (size_t k = 0; k < tr->s.a_n; k++) {
      const char *w = text + tr->s.a[k].off;
      size_t wn = tr->s.a[k].len;
      int32_t idx = strmap_get(&tr->words_by_text, w, wn);
      if (idx < 0) {
        if (lt_tok_grow((void **)&tr->words, &tr->words_cap, tr->n_words + 1, sizeof *tr->words))
          return -1;
        tword_t *tw = &tr->words[tr->n_words];
        if (!(tw->sym = malloc(wn * sizeof *tw->sym))) return -1;
        for (size_t j = 0; j < wn; j++)
          tw->sym[j] = (int32_t)n_special + (unsigned char)w[j];
        tw->n = (int32_t)wn;
        tw->count = 0;
        idx = (int32_t)tr->n_words++;
        if (lt_tok_strmap_put(&tr->words_by_text, w, wn, idx)) return -1;
      }
      tr->words[idx].count++;
    }
    seg = i + sl;
    if (sl) i += sl - 1;
  }
  return 0;
}

/* The initial vocabulary: specials, then the 256 bytes in byte order; and the pair counts.
 * 0, or -1 when out of memory. */
static int train_init_vocab(trainer_t *tr, const char *const *specials, size_t n_special) {
  uint32_t cp_of_byte[256];
  byte_unicode_table(cp_of_byte);
  for (size_t i = 0; i < n_special; i++)
    if (!(tr->vstr[tr->n_v++] = strdup(specials[i]))) return -1;
  for (int b = 0; b < 256; b++) {
    char u[5] = {0};
    utf8_put(u, cp_of_byte[b]);
    if (!(tr->vstr[tr->n_v] = strdup(u)) ||
        lt_tok_strmap_put(&tr->vmap, tr->vstr[tr->n_v], strlen(u), tr->n_v))
      return -1;
    tr->n_v++;
  }
  for (size_t i = 0; i < tr->n_words; i++)
    if (word_pairs(&tr->pc, &tr->words[i], 1)) return -1;
  return 0;
}

/* One round: merges the most frequent pair in every word. 1, 0 when no pair occurs twice, or
 * -1 when out of memory. */
static int train_merge_best(trainer_t *tr) {
  int64_t best = 0;
  uint64_t best_key = 0; /* a pair must occur at least twice; ties: smallest (left, right) */
  for (size_t i = 0; i < tr->pc.cap; i++)
    if (tr->pc.key[i] && tr->pc.count[i] >= 2 &&
        (tr->pc.count[i] > best || (tr->pc.count[i] == best && tr->pc.key[i] < best_key)))
      best = tr->pc.count[i], best_key = tr->pc.key[i];
  if (!best_key) return 0;
  int32_t a = (int32_t)((best_key - 1) >> 32), b = (int32_t)((best_key - 1) & 0xffffffffu);
  size_t la = strlen(tr->vstr[a]), lb = strlen(tr->vstr[b]);
  char *ns = malloc(la + lb + 1);
  if (!ns) return -1;
  memcpy(ns, tr->vstr[a], la);
  memcpy(ns + la, tr->vstr[b], lb + 1);
  int32_t id = strmap_get(&tr->vmap, ns, la + lb);
  if (id < 0) {
    id = tr->n_v;
    tr->vstr[tr->n_v++] = ns;
    if (lt_tok_strmap_put(&tr->vmap, ns, la + lb, id)) return -1;
  } else {
    free(ns);
  }
  tr->merges[tr->n_merges][0] = a;
  tr->merges[tr->n_merges][1] = b;
  tr->n_merges++;
  for (size_t i = 0; i < tr->n_words; i++) {
    tword_t *w = &tr->words[i];
    int32_t j = 0;
    while (j + 1 < w->n && !(w->sym[j] == a && w->sym[j + 1] == b)) j++;
    if (j + 1 >= w->n) continue;
    if (word_pairs(&tr->pc, w, -1)) return -1;
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
    if (word_pairs(&tr->pc, w, 1)) return -1;
  }
  return 1;
}

/* Writes the tokenizer.json of the trained vocabulary to *json_out. 0, or -1 when out of
 * memory. */
static int train_json(const trainer_t *tr, const char *const *specials, size_t n_special,
                      char **json_out) {
  json_t *root = json_object();
  json_t *added = json_array(), *vocab = json_object(), *jm = json_array();
  json_t *model = json_object();
  if (!root || !added || !vocab || !jm || !model) goto nomem;
  for (size_t i = 0; i < n_special; i++) {
    json_t *t = json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content",
                          specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized",
                          0, "special", 1);
    if (!t || json_array_append_new(added, t)) goto nomem;
  }
  for (int32_t i = 0; i < tr->n_v; i++)
    if (json_object_set_new(vocab, tr->vstr[i], json_integer(i))) goto nomem;
  for (size_t i = 0; i < tr->n_merges; i++) {
    json_t *pair = json_pack("[s, s]", tr->vstr[tr->merges[i][0]], tr->vstr[tr->merges[i][1]]);
    if (!pair || json_array_append_new(jm, pair)) goto nomem;
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
  *json_out = json_dumps(root, JSON_PRESERVE_ORDER | JSON_INDENT(1) | JSON_ENSURE_ASCII);
  json_decref(root);
  return *json_out ? 0 : -1;

nomem:
  json_decref(added);
  json_decref(vocab);
  json_decref(jm);
  json_decref(model);
  json_decref(root);
  return -1;
}

static void trainer_free(trainer_t *tr) {
  pcre2_code_free(tr->st.re);
  lt_tok_scratch_free(&tr->s);
  lt_tok_strmap_free(&tr->words_by_text);
  lt_tok_strmap_free(&tr->vmap);
  for (size_t i = 0; i < tr->n_words; i++) free(tr->words[i].sym);
  free(tr->words);
  free(tr->pc.key);
  free(tr->pc.count);
  if (tr->vstr)
    for (int32_t i = 0; i < tr->vocab_size; i++) free(tr->vstr[i]);
  free(tr->vstr);
  free(tr->merges);
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
  lt_err_t err;
  trainer_t tr = {.st = {.kind = STEP_REGEX}, .vocab_size = vocab_size};
  if ((err = lt_tok_compile_regex(LT_TOK_GPT2_PATTERN, sizeof LT_TOK_GPT2_PATTERN - 1, &tr.st.re,
                                  "train", errstr, errstr_size)))
    return err;
  int r = 0;
  if (!(tr.s.md = pcre2_match_data_create(4, NULL)) ||
      lt_tok_strmap_init(&tr.words_by_text, 1 << 14) ||
      lt_tok_strmap_init(&tr.vmap, (size_t)vocab_size) ||
      !(tr.vstr = calloc((size_t)vocab_size, sizeof *tr.vstr)) ||
      !(tr.merges = calloc((size_t)vocab_size, sizeof *tr.merges)) ||
      train_count_words(&tr, text, len, specials, n_special) ||
      train_init_vocab(&tr, specials, n_special))
    r = -1;
  while (r == 0 && tr.n_v < vocab_size) {
    int merged = train_merge_best(&tr);
    if (merged < 0) r = -1;
    else if (merged == 0) break;
  }
  if (r == 0) r = train_json(&tr, specials, n_special, json_out);
  trainer_free(&tr);
  if (r) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "train: out of memory");
  return LT_OK;
}
