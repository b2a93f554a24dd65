/* lt_tok: byte-level BPE tokenizer (see lt_tok.h for the contract).
 *
 * Pipeline of lt_tok_encode: split the text on added tokens (leftmost-longest), then for each
 * plain segment run the pre-tokenizer steps (PCRE2 regexes compiled with UTF + UCP, so \p{L},
 * \p{N} and \s follow Unicode; invalid UTF-8 never matches and falls into the gaps, which
 * become their own pre-tokens), then BPE each pre-token: start from the byte tokens and apply
 * the lowest-ranked adjacent merge first (ties: leftmost), with a binary heap over a linked
 * list of symbols, so a long word costs O(n log n). Merges are looked up by (left id, right
 * id) in an open-addressing hash map.
 *
 * This file holds the hash maps, encoding, decoding and the dataset templates; tokenizer.json
 * is read by lt_tok_load.c and a vocabulary trained by lt_tok_train.c (shared structures in
 * lt_tok_int.h).
 */
#include <jansson.h>
#include <stdio.h>

#include "lt_tok_int.h"

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

int lt_tok_strmap_init(strmap_t *m, size_t want) {
  size_t cap = map_cap(want);
  m->key = calloc(cap, sizeof *m->key);
  m->klen = calloc(cap, sizeof *m->klen);
  m->val = calloc(cap, sizeof *m->val);
  m->cap = cap;
  m->n = 0;
  return m->key && m->klen && m->val ? 0 : -1;
}

void lt_tok_strmap_free(strmap_t *m) {
  free(m->key);
  free(m->klen);
  free(m->val);
  memset(m, 0, sizeof *m);
}

static int strmap_grow(strmap_t *m);

int lt_tok_strmap_put(strmap_t *m, const char *k, size_t n, int32_t v) {
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
  if (lt_tok_strmap_init(&big, m->cap)) {
    lt_tok_strmap_free(&big);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->key[i]) lt_tok_strmap_put(&big, m->key[i], m->klen[i], m->val[i]);
  lt_tok_strmap_free(m);
  *m = big;
  return 0;
}

static void pairmap_free(pairmap_t *m) {
  free(m->key);
  free(m->rank);
  free(m->merged);
  memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- the tokenizer */

void lt_tok_seq_init(lt_tok_seq_t *seq) { memset(seq, 0, sizeof *seq); }

void lt_tok_seq_free(lt_tok_seq_t *seq) {
  if (!seq) return;
  if (seq->ids) explicit_bzero(seq->ids, seq->cap * sizeof *seq->ids); /* a tenant's text, as ids */
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

void lt_tok_destroy(lt_tok_t *tok) {
  if (!tok) return;
  if (tok->entries)
    for (int32_t i = 0; i < tok->n_ids; i++) free(tok->entries[i].str);
  free(tok->entries);
  lt_tok_strmap_free(&tok->vocab);
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
  return id >= 0 && id < tok->n_ids ? tok->entries[id].str : NULL;
}

int lt_tok_is_special(const lt_tok_t *tok, int32_t id) {
  return id >= 0 && id < tok->n_ids && tok->entries[id].added == 2;
}

int32_t lt_tok_eos_id(const lt_tok_t *tok) {
  static const char *const names[] = {"<|endoftext|>", "</s>", "<|im_end|>"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int32_t id = lt_tok_token_id(tok, names[i]);
    if (id >= 0) return id;
  }
  return -1;
}

/* ---------------------------------------------------------------- encoding */

void lt_tok_scratch_free(scratch_t *s) {
  free(s->a);
  free(s->b);
  free(s->sym);
  free(s->heap);
  free(s->text);
  if (s->md) pcre2_match_data_free(s->md);
}

int lt_tok_grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *np = realloc(*p, c * elem);
  if (!np) return -1;
  *p = np;
  *cap = c;
  return 0;
}

int lt_tok_span_push(span_t **v, size_t *n, size_t *cap, size_t off, size_t len) {
  if (len == 0) return 0;
  if (lt_tok_grow((void **)v, cap, *n + 1, sizeof **v)) return -1;
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
    if (lt_tok_grow((void **)&s->text, &s->text_cap, n * 2, 1)) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += utf8_put(s->text + k, tok->cp_of_byte[w[i]]);
    int32_t id = strmap_get(&tok->vocab, s->text, k);
    if (id >= 0 && !tok->entries[id].added) return seq_push(seq, id, weight);
  }
  if (lt_tok_grow((void **)&s->sym, &s->sym_cap, n, sizeof *s->sym) ||
      lt_tok_grow((void **)&s->heap, &s->heap_cap, 2 * n + 2, sizeof *s->heap))
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
int lt_tok_apply_step(const pre_step_t *st, const char *text, scratch_t *s) {
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
        if (lt_tok_span_push(&s->b, &s->b_n, &s->b_cap, i, j - i)) return -1;
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
        if (lt_tok_span_push(&s->b, &s->b_n, &s->b_cap, pos, me - pos)) return -1;
        pos = me;
        continue;
      }
      if (lt_tok_span_push(&s->b, &s->b_n, &s->b_cap, pos, ms - pos)) return -1;
      if (!st->removed && lt_tok_span_push(&s->b, &s->b_n, &s->b_cap, ms, me - ms)) return -1;
      pos = me;
    }
    if (pos < end && lt_tok_span_push(&s->b, &s->b_n, &s->b_cap, pos, end - pos)) return -1;
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
  int r = lt_tok_span_push(&s->a, &s->a_n, &s->a_cap, 0, len);
  for (size_t i = 0; !r && i < tok->n_steps; i++) r = lt_tok_apply_step(&tok->steps[i], text, s);
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
  lt_tok_scratch_free(&s);
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
    if (ids[i] < 0 || ids[i] >= tok->n_ids || !tok->entries[ids[i]].str)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "decode: ids[%zu] = %d is not a token of this tokenizer (vocab size %d)", i,
                     ids[i], tok->n_ids);
    cap += tok->entries[ids[i]].len;
  }
  char *buf = malloc(cap);
  if (!buf) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "decode: out of memory");
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    const tok_entry_t *te = &tok->entries[id];
    const unsigned char *s = (const unsigned char *)te->str;
    size_t len = te->len;
    if (te->added) {
      if (te->added == 2 && skip_special) continue;
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
    float w = strcmp(msgs[i].role, "assistant") == 0 && !msgs[i].no_loss ? 1.0f : 0.0f;
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
      json_t *weight = json_object_get(o, "weight");
      msgs[i].no_loss = json_is_integer(weight) && json_integer_value(weight) == 0;
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
