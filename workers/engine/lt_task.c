/* lt_task: deterministic corpus and the date-iso fine-tuning task (see lt_task.h).
 *
 * The generators only use integer arithmetic on a splitmix64 stream and fixed word lists, so
 * the output is byte-identical on every machine. Changing a word list or a template changes
 * the corpus, the tokenizer and the base model: treat them as versioned data.
 */
#include "lt_task.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_rand.h"
#include "lt_tok.h"

const char *const lt_task_specials[LT_TASK_N_SPECIAL] = {"<|endoftext|>", "<|im_start|>",
                                                         "<|im_end|>"};

/* ---------------------------------------------------------------- rng, buffer */

typedef struct rng {
  uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) { return lt_splitmix64(&r->s); }

static uint32_t rng_below(rng_t *r, uint32_t n) { return (uint32_t)(rng_next(r) % n); }

#define PICK(r, arr) (arr)[rng_below((r), sizeof(arr) / sizeof((arr)[0]))]

typedef struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = 1;
      return;
    }
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
}

/* ---------------------------------------------------------------- calendar */

static const char *const k_months[12] = {"January", "February", "March",     "April",
                                         "May",     "June",     "July",      "August",
                                         "September", "October", "November", "December"};
static const char *const k_ordinals[12] = {"first",   "second", "third", "fourth",
                                           "fifth",   "sixth",  "seventh", "eighth",
                                           "ninth",   "tenth",  "eleventh", "twelfth"};

static int days_in_month(int y, int m) {
  static const int d[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return d[m - 1] + (m == 2 && leap);
}

typedef struct date {
  int y, m, d;
} date_t;

#define FIRST_YEAR 1950
#define N_YEARS 100
#define N_DATES 36524 /* days from 1950-01-01 to 2049-12-31 */

/* The k-th day (0-based) from 1950-01-01. */
static date_t date_of_index(int k) {
  date_t t = {FIRST_YEAR, 1, 1};
  while (k > 0) {
    int left = days_in_month(t.y, t.m) - t.d + 1; /* days until the next month starts */
    if (k >= left) {
      k -= left;
      t.d = 1;
      if (++t.m == 13) t.m = 1, t.y++;
    } else {
      t.d += k;
      k = 0;
    }
  }
  return t;
}

static date_t random_date(rng_t *r) { return date_of_index((int)rng_below(r, N_DATES)); }

/* Prose form: 0 "March 5, 2021", 1 "5 March 2021". */
static void sb_prose_date(sbuf_t *b, date_t t, int form) {
  if (form == 0)
    sb_printf(b, "%s %d, %d", k_months[t.m - 1], t.d, t.y);
  else
    sb_printf(b, "%d %s %d", t.d, k_months[t.m - 1], t.y);
}

static void sb_iso_date(sbuf_t *b, date_t t) { sb_printf(b, "%04d-%02d-%02d", t.y, t.m, t.d); }

/* ---------------------------------------------------------------- corpus */

static const char *const k_names[] = {
    "Alice", "Bob",   "Carol", "David", "Emma",  "Frank", "Grace", "Henry", "Irene", "Jack",
    "Karen", "Leo",   "Maria", "Nina",  "Oscar", "Paul",  "Quinn", "Rosa",  "Sam",   "Tina",
    "Uma",   "Victor", "Wendy", "Yusuf", "Zoe",  "Omar",  "Lena",  "Hugo",  "Ines",  "Theo"};
static const char *const k_adjs[] = {"old",   "new",    "red",   "blue",  "small", "large",
                                     "quiet", "busy",   "green", "broken", "clean", "heavy",
                                     "warm",  "bright", "empty", "famous", "narrow", "wooden"};
static const char *const k_nouns[] = {"library", "bridge",  "garden", "bicycle", "kitchen",
                                      "station", "market",  "museum", "harbor",  "school",
                                      "bakery",  "tower",   "river",  "office",  "theater",
                                      "window",  "piano",   "boat",   "lamp",    "clock"};
static const char *const k_verbs[] = {"visited", "painted", "repaired", "cleaned", "opened",
                                      "closed",  "sold",    "bought",   "found",   "photographed",
                                      "measured", "locked", "moved",    "sketched", "inspected"};
static const char *const k_cities[] = {"Paris", "Lisbon", "Oslo",   "Cairo",  "Lima",  "Tokyo",
                                       "Dakar", "Quito",  "Vienna", "Dublin", "Hanoi", "Perth",
                                       "Riga",  "Seoul",  "Turin",  "Austin"};
static const char *const k_events[] = {"meeting", "concert", "wedding", "exam",  "launch",
                                       "race",    "festival", "trial",  "party", "lecture"};
static const char *const k_fruits[] = {"apple", "pear",  "plum",   "cherry", "lemon", "mango",
                                       "grape", "melon", "banana", "peach",  "kiwi",  "fig"};

static void doc_story(sbuf_t *b, rng_t *r) {
  int n = 2 + (int)rng_below(r, 3);
  for (int i = 0; i < n; i++) {
    date_t t = random_date(r);
    switch (rng_below(r, 5)) {
    case 0:
      sb_printf(b, "%s %s the %s %s on ", PICK(r, k_names), PICK(r, k_verbs), PICK(r, k_adjs),
                PICK(r, k_nouns));
      sb_prose_date(b, t, (int)rng_below(r, 2));
      sb_printf(b, ".");
      break;
    case 1:
      sb_printf(b, "On ");
      sb_prose_date(b, t, (int)rng_below(r, 2));
      sb_printf(b, ", %s %s the %s in %s.", PICK(r, k_names), PICK(r, k_verbs), PICK(r, k_nouns),
                PICK(r, k_cities));
      break;
    case 2:
      sb_printf(b, "The %s in %s was moved to ", PICK(r, k_events), PICK(r, k_cities));
      sb_prose_date(b, t, (int)rng_below(r, 2));
      sb_printf(b, ".");
      break;
    case 3:
      sb_printf(b, "%s was born on ", PICK(r, k_names));
      sb_prose_date(b, t, (int)rng_below(r, 2));
      sb_printf(b, " in %s.", PICK(r, k_cities));
      break;
    default:
      sb_printf(b, "%s and %s met at the %s %s in %s %d.", PICK(r, k_names), PICK(r, k_names),
                PICK(r, k_adjs), PICK(r, k_nouns), k_months[t.m - 1], t.y);
      break;
    }
    sb_printf(b, i + 1 < n ? " " : "\n");
  }
}

static void doc_records(sbuf_t *b, rng_t *r) {
  int n = 2 + (int)rng_below(r, 4);
  for (int i = 0; i < n; i++) {
    sb_printf(b, "id=%u name=%s city=%s date=", 100 + rng_below(r, 900), PICK(r, k_names),
              PICK(r, k_cities));
    sb_iso_date(b, random_date(r));
    sb_printf(b, " count=%u\n", rng_below(r, 100));
  }
}

static void doc_calendar(sbuf_t *b, rng_t *r) {
  int m = (int)rng_below(r, 12);
  switch (rng_below(r, 4)) {
  case 0:
    sb_printf(b, "%s is month %02d of the year.\n", k_months[m], m + 1);
    break;
  case 1:
    sb_printf(b, "Month %02d is %s, the %s month.\n", m + 1, k_months[m], k_ordinals[m]);
    break;
  case 2:
    sb_printf(b, "The month after %s is %s.\n", k_months[m], k_months[(m + 1) % 12]);
    break;
  default: { /* a month's days, zero-padded as in ISO dates */
    int y = FIRST_YEAR + (int)rng_below(r, N_YEARS);
    int d = 1 + (int)rng_below(r, (uint32_t)days_in_month(y, m + 1) - 2);
    sb_printf(b, "In %d, %s has %d days. Days %02d, %02d and %02d are in the month %d-%02d.\n", y,
              k_months[m], days_in_month(y, m + 1), d, d + 1, d + 2, y, m + 1);
  }
  }
}

static void doc_card(sbuf_t *b, rng_t *r) {
  date_t t = random_date(r);
  sb_printf(b, "name: %s\ncity: %s\nevent: %s\n", PICK(r, k_names), PICK(r, k_cities),
            PICK(r, k_events));
  if (rng_below(r, 2)) {
    sb_printf(b, "when: ");
    sb_prose_date(b, t, (int)rng_below(r, 2));
  } else {
    sb_printf(b, "day: ");
    sb_iso_date(b, t);
  }
  sb_printf(b, "\nseats: %u\n", 10 + rng_below(r, 490));
}

static void doc_math(sbuf_t *b, rng_t *r) {
  int n = 2 + (int)rng_below(r, 4);
  for (int i = 0; i < n; i++) {
    unsigned x = rng_below(r, 100), y = rng_below(r, 100);
    switch (rng_below(r, 3)) {
    case 0:
      sb_printf(b, "%u + %u = %u\n", x, y, x + y);
      break;
    case 1:
      sb_printf(b, "%u - %u = %d\n", x, y, (int)x - (int)y);
      break;
    default:
      sb_printf(b, "%u * %u = %u\n", x % 13, y % 13, (x % 13) * (y % 13));
    }
  }
}

static void doc_list(sbuf_t *b, rng_t *r) {
  int n = 3 + (int)rng_below(r, 4);
  sb_printf(b, "%s bought ", PICK(r, k_names));
  for (int i = 0; i < n; i++)
    sb_printf(b, "%s%s", PICK(r, k_fruits), i + 2 < n ? ", " : i + 1 < n ? " and " : ".\n");
  sb_printf(b, "items: ");
  for (int i = 0; i < n; i++)
    sb_printf(b, "%u %s%s", 1 + rng_below(r, 9), PICK(r, k_fruits), i + 1 < n ? "; " : "\n");
}

lt_err_t lt_task_corpus(uint64_t seed, size_t target_bytes, char **out, size_t *out_len,
                        char *errstr, size_t errstr_size) {
  *out = NULL;
  *out_len = 0;
  rng_t r = {seed};
  sbuf_t b = {0};
  /* Mixture weights out of 16: prose dates and records dominate; calendar facts are short. */
  while (b.len < target_bytes && !b.oom) {
    uint32_t k = rng_below(&r, 16);
    if (k < 5)
      doc_story(&b, &r);
    else if (k < 8)
      doc_records(&b, &r);
    else if (k < 11)
      doc_calendar(&b, &r);
    else if (k < 13)
      doc_card(&b, &r);
    else if (k < 15)
      doc_math(&b, &r);
    else
      doc_list(&b, &r);
    sb_printf(&b, "%s", lt_task_specials[0]);
  }
  if (!b.p) sb_printf(&b, "%s", "");
  if (b.oom) {
    free(b.p);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "corpus: out of memory");
  }
  *out = b.p;
  *out_len = b.len;
  return LT_OK;
}

/* ---------------------------------------------------------------- task */

static void sb_example(sbuf_t *b, date_t t, int form) {
  /* Hand-written JSON: the text is ASCII without quotes or backslashes. */
  sb_printf(b, "{\"prompt\": \"date: ");
  sb_prose_date(b, t, form);
  sb_printf(b, "\\niso:\", \"completion\": \" ");
  sb_iso_date(b, t);
  sb_printf(b, "\"}\n");
}

lt_err_t lt_task_dates(uint64_t seed, size_t n_train, size_t n_eval, char **train,
                       size_t *train_len, char **eval, size_t *eval_len, char *errstr,
                       size_t errstr_size) {
  *train = *eval = NULL;
  *train_len = *eval_len = 0;
  if (n_train == 0 || n_eval == 0 || n_train + n_eval > N_DATES)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "task: n_train=%zu n_eval=%zu: expected both >= 1 and a sum <= %d (distinct "
                   "dates 1950-2049)",
                   n_train, n_eval, N_DATES);
  /* A seeded Fisher-Yates shuffle of all day indices: the first n_eval are eval dates, the
   * next n_train train dates, so no calendar date is in both. */
  int *perm = malloc(N_DATES * sizeof *perm);
  if (!perm) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "task: out of memory");
  for (int i = 0; i < N_DATES; i++) perm[i] = i;
  rng_t r = {seed};
  for (int i = N_DATES - 1; i > 0; i--) {
    int j = (int)rng_below(&r, (uint32_t)i + 1);
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  sbuf_t bt = {0}, be = {0};
  for (size_t i = 0; i < n_eval; i++)
    sb_example(&be, date_of_index(perm[i]), (int)rng_below(&r, 2));
  for (size_t i = 0; i < n_train; i++)
    sb_example(&bt, date_of_index(perm[n_eval + i]), (int)rng_below(&r, 2));
  free(perm);
  if (bt.oom || be.oom) {
    free(bt.p);
    free(be.p);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "task: out of memory");
  }
  *train = bt.p, *train_len = bt.len;
  *eval = be.p, *eval_len = be.len;
  return LT_OK;
}

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

int lt_task_exact_match(const char *expected, size_t expected_len, const char *got,
                        size_t got_len) {
  while (expected_len && is_space(*expected)) expected++, expected_len--;
  while (expected_len && is_space(expected[expected_len - 1])) expected_len--;
  while (got_len && is_space(*got)) got++, got_len--;
  while (got_len && is_space(got[got_len - 1])) got_len--;
  return expected_len == got_len && memcmp(expected, got, got_len) == 0;
}

/* ---------------------------------------------------------------- bundle */

static lt_err_t write_file(const char *dir, const char *name, const char *data, size_t len,
                           char *errstr, size_t errstr_size) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  size_t w = fwrite(data, 1, len, f);
  int bad = w != len || fflush(f) != 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    lt_err_t e = lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot write: %s", path,
                         strerror(errno));
    remove(tmp);
    return e;
  }
  return LT_OK;
}

lt_err_t lt_task_write_bundle(const char *dir, uint64_t seed, size_t corpus_bytes,
                              int32_t vocab_size, size_t n_train, size_t n_eval, char *errstr,
                              size_t errstr_size) {
  char *corpus = NULL, *json = NULL, *train = NULL, *eval = NULL;
  size_t corpus_len, train_len, eval_len;
  lt_err_t err;
  if (!(err = lt_task_corpus(seed, corpus_bytes, &corpus, &corpus_len, errstr, errstr_size)) &&
      !(err = write_file(dir, "corpus.txt", corpus, corpus_len, errstr, errstr_size)) &&
      !(err = lt_tok_train(corpus, corpus_len, vocab_size, lt_task_specials, LT_TASK_N_SPECIAL,
                           &json, errstr, errstr_size)) &&
      !(err = write_file(dir, "tokenizer.json", json, strlen(json), errstr, errstr_size)) &&
      !(err = lt_task_dates(seed + 1, n_train, n_eval, &train, &train_len, &eval, &eval_len,
                            errstr, errstr_size)) &&
      !(err = write_file(dir, "task_train.jsonl", train, train_len, errstr, errstr_size)))
    err = write_file(dir, "task_eval.jsonl", eval, eval_len, errstr, errstr_size);
  free(corpus);
  free(json);
  free(train);
  free(eval);
  return err;
}
