/* Tests of lt_task: the corpus and the date-iso task are pure functions of their seed, train
 * and eval never share a calendar date, the corpus never contains the task's pairing, every
 * example is well-formed and correct, and the exact-match scorer trims only whitespace. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_task.h"
#include "lt_tok.h"

#define LT_TEST_CORPUS_LEN 65754
#define LT_TEST_CORPUS_FNV 0xf13b427cce948289ull

static const char *const k_months[12] = {"January", "February", "March",     "April",
                                         "May",     "June",     "July",      "August",
                                         "September", "October", "November", "December"};

Test(task, corpus_is_identical_for_the_same_seed_and_differs_across_seeds) {
  char *a, *b, *c, err[128];
  size_t la, lb, lc;
  cr_assert_eq(lt_task_corpus(42, 200000, &a, &la, err, sizeof err), LT_OK);
  cr_assert_eq(lt_task_corpus(42, 200000, &b, &lb, err, sizeof err), LT_OK);
  cr_assert_eq(lt_task_corpus(43, 200000, &c, &lc, err, sizeof err), LT_OK);
  cr_assert_geq(la, 200000);
  cr_assert_lt(la, 201000);
  cr_assert_eq(la, lb);
  cr_assert_eq(memcmp(a, b, la), 0);
  cr_assert(la != lc || memcmp(a, c, la) != 0);
  cr_assert_eq(strlen(a), la);
  free(a);
  free(b);
  free(c);
}

/* A fixed digest of seed 1's first 64 KiB pins the generator across machines and compilers:
 * if this changes, the bundled base model changes too (bump its version on purpose). */
Test(task, corpus_bytes_are_pinned) {
  char *a, err[128];
  size_t la;
  cr_assert_eq(lt_task_corpus(1, 65536, &a, &la, err, sizeof err), LT_OK);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < la; i++) h = (h ^ (unsigned char)a[i]) * 1099511628211ull;
  fprintf(stderr, "corpus seed 1 64KiB: len %zu fnv1a %016llx\n", la, (unsigned long long)h);
  cr_assert_eq(la, LT_TEST_CORPUS_LEN);
  cr_assert_eq(h, LT_TEST_CORPUS_FNV);
  free(a);
}

Test(task, corpus_primes_but_never_contains_the_task) {
  char *a, err[128];
  size_t la;
  cr_assert_eq(lt_task_corpus(5, 1 << 20, &a, &la, err, sizeof err), LT_OK);
  cr_assert_null(strstr(a, "iso"), "the task's field name must not appear in the corpus");
  cr_assert_not_null(strstr(a, "date="), "ISO dates in records");
  cr_assert_not_null(strstr(a, "is month 03"), "month numbers");
  cr_assert_not_null(strstr(a, "<|endoftext|>"), "document separators");
  int prose = 0;
  for (int m = 0; m < 12; m++) prose += strstr(a, k_months[m]) != NULL;
  cr_assert_eq(prose, 12);
  /* No line holds a prose date and an ISO date: the conversion itself is never shown. */
  for (char *line = a; *line;) {
    char *end = strchr(line, '\n');
    size_t n = end ? (size_t)(end - line) : strlen(line);
    int has_month = 0, has_iso = 0;
    for (int m = 0; m < 12; m++) has_month |= memmem(line, n, k_months[m], strlen(k_months[m])) != NULL;
    for (size_t i = 0; i + 10 <= n; i++)
      if (line[i + 4] == '-' && line[i + 7] == '-' && line[i] >= '0' && line[i] <= '9' &&
          line[i + 9] >= '0' && line[i + 9] <= '9')
        has_iso = 1;
    cr_assert(!(has_month && has_iso), "line mixes prose and ISO dates: %.*s", (int)n, line);
    line = end ? end + 1 : line + n;
  }
  free(a);
}

typedef struct ex {
  char *prompt, *completion;
} ex_t;

static size_t parse_jsonl(const char *text, ex_t **out) {
  size_t n = 0, cap = 64;
  ex_t *v = malloc(cap * sizeof *v);
  const char *p = text;
  while (*p) {
    const char *e = strchr(p, '\n');
    cr_assert_not_null(e, "every line ends with a newline");
    json_error_t je;
    json_t *o = json_loadb(p, (size_t)(e - p), 0, &je);
    cr_assert_not_null(o, "line %zu: %s", n + 1, je.text);
    cr_assert_eq(json_object_size(o), 2);
    const char *pr = json_string_value(json_object_get(o, "prompt"));
    const char *co = json_string_value(json_object_get(o, "completion"));
    cr_assert(pr && co);
    if (n == cap) v = realloc(v, (cap *= 2) * sizeof *v);
    v[n].prompt = strdup(pr);
    v[n].completion = strdup(co);
    n++;
    json_decref(o);
    p = e + 1;
  }
  *out = v;
  return n;
}

static void free_ex(ex_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i].prompt), free(v[i].completion);
  free(v);
}

/* Parses a prompt back into (y, m, d); returns 0 when the prompt has neither form. */
static int prompt_date(const char *p, int *y, int *m, int *d) {
  char mon[16];
  if (sscanf(p, "date: %15[A-Za-z] %d, %d\niso:", mon, d, y) != 3 &&
      sscanf(p, "date: %d %15[A-Za-z] %d\niso:", d, mon, y) != 3)
    return 0;
  for (*m = 1; *m <= 12; (*m)++)
    if (strcmp(mon, k_months[*m - 1]) == 0) return 1;
  return 0;
}

Test(task, dates_are_deterministic_correct_and_train_eval_disjoint) {
  char *t1, *e1, *t2, *e2, err[128];
  size_t lt1, le1, lt2, le2;
  cr_assert_eq(lt_task_dates(9, 3000, 300, &t1, &lt1, &e1, &le1, err, sizeof err), LT_OK);
  cr_assert_eq(lt_task_dates(9, 3000, 300, &t2, &lt2, &e2, &le2, err, sizeof err), LT_OK);
  cr_assert(lt1 == lt2 && memcmp(t1, t2, lt1) == 0);
  cr_assert(le1 == le2 && memcmp(e1, e2, le1) == 0);
  ex_t *tr, *ev;
  size_t ntr = parse_jsonl(t1, &tr), nev = parse_jsonl(e1, &ev);
  cr_assert_eq(ntr, 3000);
  cr_assert_eq(nev, 300);
  static unsigned char seen[100][13][32];
  memset(seen, 0, sizeof seen);
  int forms[2] = {0, 0};
  for (int set = 0; set < 2; set++) {
    ex_t *v = set ? ev : tr;
    size_t n = set ? nev : ntr;
    for (size_t i = 0; i < n; i++) {
      int y, m, d;
      cr_assert(prompt_date(v[i].prompt, &y, &m, &d), "bad prompt \"%s\"", v[i].prompt);
      forms[v[i].prompt[6] >= '0' && v[i].prompt[6] <= '9']++;
      cr_assert(y >= 1950 && y <= 2049 && d >= 1 && d <= 31);
      char want[16];
      snprintf(want, sizeof want, " %04d-%02d-%02d", y, m, d);
      cr_assert_str_eq(v[i].completion, want, "prompt \"%s\"", v[i].prompt);
      unsigned char *s = &seen[y - 1950][m][d];
      if (set == 1) cr_assert_eq(*s & 1, 0, "eval date %s is also in train", want);
      *s |= (unsigned char)(set ? 2 : 1);
    }
  }
  cr_assert_gt(forms[0], 100);
  cr_assert_gt(forms[1], 100);
  /* invalid dates never appear: February 30, April 31 */
  cr_assert_null(strstr(t1, "February 30"));
  cr_assert_null(strstr(t1, "31 April"));
  free_ex(tr, ntr);
  free_ex(ev, nev);
  free(t1), free(e1), free(t2), free(e2);
}

Test(task, dates_reject_impossible_sizes) {
  char *t, *e, err[256];
  size_t lt, le;
  cr_assert_eq(lt_task_dates(1, 36000, 1000, &t, &lt, &e, &le, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "n_train=36000") != NULL, "%s", err);
  cr_assert_eq(lt_task_dates(1, 10, 0, &t, &lt, &e, &le, err, sizeof err), LT_ERR_INVALID);
}

Test(task, exact_match_trims_whitespace_and_nothing_else) {
  cr_assert(lt_task_exact_match(" 2021-03-05", 11, "2021-03-05", 10));
  cr_assert(lt_task_exact_match(" 2021-03-05", 11, " 2021-03-05\n", 12));
  cr_assert(lt_task_exact_match("", 0, "  \n", 3));
  cr_assert_not(lt_task_exact_match(" 2021-03-05", 11, "2021-03-5", 9));
  cr_assert_not(lt_task_exact_match(" 2021-03-05", 11, "2021-03-05 x", 12));
  cr_assert_not(lt_task_exact_match(" 2021-03-05", 11, "2021-03-050", 11));
  cr_assert_not(lt_task_exact_match(" 2021-03-05", 11, "2021 03 05", 10));
  cr_assert_not(lt_task_exact_match(" 2021-03-05", 11, "", 0));
}

Test(task, bundle_writes_four_loadable_files, .timeout = 300) {
  char dir[] = "/tmp/lt_test_task.XXXXXX", err[256], path[300];
  cr_assert_not_null(mkdtemp(dir));
  cr_assert_eq(lt_task_write_bundle(dir, 1, 300000, 512, 100, 20, err, sizeof err), LT_OK, "%s",
               err);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  lt_tok_t *tok;
  cr_assert_eq(lt_tok_load_file(path, &tok, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_tok_vocab_size(tok), 512);
  lt_tok_destroy(tok);
  const char *names[] = {"corpus.txt", "tokenizer.json", "task_train.jsonl", "task_eval.jsonl"};
  for (int i = 0; i < 4; i++) {
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    cr_assert_gt(st.st_size, 100);
    unlink(path);
  }
  rmdir(dir);
  cr_assert_eq(lt_task_write_bundle("/nonexistent/dir", 1, 1000, 512, 10, 2, err, sizeof err),
               LT_ERR_IO);
  cr_assert(strstr(err, "/nonexistent/dir/corpus.txt") != NULL, "%s", err);
}
