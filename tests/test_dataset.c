/* lt_dataset: every bad line is reported with line, field and reason; streaming in any chunk
 * size gives the same report; quotas stop the upload. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "lt_dataset.h"

/* A stand-in token count (one token per 4 bytes of text): the checker's logic, not the
 * tokenizer, is under test here; the real tokenizer is wired in by the API. */
static int64_t fake_tokens(void *ctx, lt_dataset_format_t f, const json_t *line) {
  (void)ctx;
  int64_t n = 0;
  if (f == LT_DATASET_PROMPT_COMPLETION) {
    n += (int64_t)json_string_length(json_object_get(line, "prompt"));
    n += (int64_t)json_string_length(json_object_get(line, "completion"));
  } else {
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(line, "messages"), i, m) n += (int64_t)json_string_length(json_object_get(m, "content"));
  }
  return (n + 3) / 4;
}

/* Checkers of the running test: a report's errors live in its checker, so they are kept until
 * the test ends. */
static lt_dataset_check_t *checkers[8];
static int nchecker;

static void drop_checkers(void) {
  while (nchecker) lt_dataset_check_destroy(checkers[--nchecker]);
}

TestSuite(dataset, .fini = drop_checkers);

/* Checks text fed in pieces of chunk bytes; the outcome must be want. */
static lt_dataset_report_t report(const char *text, size_t chunk, lt_dataset_limits_t *lim, lt_err_t want) {
  cr_assert_lt(nchecker, 8);
  lt_dataset_check_t *c;
  cr_assert_eq(lt_dataset_check_new(&c, lim, fake_tokens, NULL), LT_OK);
  checkers[nchecker++] = c;
  size_t n = strlen(text);
  for (size_t i = 0; i < n; i += chunk) {
    size_t k = n - i < chunk ? n - i : chunk;
    if (lt_dataset_check_feed(c, text + i, k) == LT_ERR_QUOTA) break;
  }
  lt_dataset_report_t r;
  lt_err_t got = lt_dataset_check_finish(c, &r);
  cr_assert_eq(got, want, "%s, wanted %s", lt_err_name(got), lt_err_name(want));
  return r;
}

/* report() on line repeated n times (at most 4 KiB in all). */
static lt_dataset_report_t report_repeated(const char *line, int n, size_t chunk, lt_dataset_limits_t *lim,
                                           lt_err_t want) {
  char text[4096] = "";
  for (int i = 0; i < n; i++) strcat(text, line);
  return report(text, chunk, lim, want);
}

static const lt_dataset_error_t *find(const lt_dataset_report_t *r, uint64_t line) {
  for (size_t i = 0; i < r->errors_kept; i++)
    if (r->errors[i].line == line) return &r->errors[i];
  return NULL;
}

Test(dataset, valid_prompt_completion_file_gives_a_preflight_report) {
  const char *text = "{\"prompt\":\"2024-01-05\",\"completion\":\"5 Jan 2024\"}\n"
                     "\n"
                     "{\"prompt\":\"a longer prompt here\",\"completion\":\"ok\",\"meta\":1}\r\n"
                     "{\"prompt\":\"x\",\"completion\":\"y\"}"; /* no final newline */
  lt_dataset_report_t r = report(text, 1 << 20, NULL, LT_OK);
  cr_assert_eq(r.format, LT_DATASET_PROMPT_COMPLETION);
  cr_assert_eq(r.examples, 3);
  cr_assert_eq(r.lines, 4);
  cr_assert_eq(r.longest_line, 3);
  cr_assert_eq(r.longest_tokens, 6);
  cr_assert_eq(r.tokens, 5 + 6 + 1);
  json_t *j = lt_dataset_report_json(&r, 3);
  cr_assert_eq(json_integer_value(json_object_get(j, "estimated_cost_token_steps")), 36);
  json_decref(j);
}

Test(dataset, every_kind_of_bad_line_is_named) {
  lt_dataset_limits_t lim = {.max_tokens = 8};
  const char *text =
      "{\"prompt\":\"ok\",\"completion\":\"fine\"}\n"                         /* 1 good */
      "{\"prompt\":\"ok\",\"completion\":\n"                                 /* 2 bad JSON */
      "{\"prompt\":\"caf\xc3\x28\",\"completion\":\"x\"}\n"                  /* 3 bad UTF-8 */
      "{\"prompt\":\"ok\"}\n"                                                /* 4 missing */
      "{\"prompt\":\"ok\",\"completion\":\"   \"}\n"                         /* 5 empty */
      "{\"prompt\":\"ok\",\"completion\":42}\n"                              /* 6 type */
      "{\"prompt\":\"a very long prompt that is far too long\",\"completion\":\"x\"}\n" /* 7 tokens */
      "[1,2]\n"                                                              /* 8 not object */
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}\n"; /* 9 format */
  lt_dataset_report_t r = report(text, 7, &lim, LT_ERR_INVALID);
  cr_assert_eq(r.examples, 1);
  cr_assert_eq(r.error_count, 8);
  struct { uint64_t line; const char *field, *words; } want[] = {
      {2, "", "invalid JSON"},        {3, "", "invalid UTF-8 at byte 15"},
      {4, "completion", "missing"},  {5, "completion", "empty"},
      {6, "completion", "string"},   {7, "", "over the limit of 8"},
      {8, "", "JSON object"},        {9, "messages", "one per file"},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    const lt_dataset_error_t *e = find(&r, want[i].line);
    cr_assert_not_null(e, "no error for line %llu", (unsigned long long)want[i].line);
    cr_assert_str_eq(e->field, want[i].field, "line %llu: %s", (unsigned long long)want[i].line, e->reason);
    cr_assert(strstr(e->reason, want[i].words), "line %llu: \"%s\"", (unsigned long long)want[i].line, e->reason);
  }
}

Test(dataset, chat_messages_are_checked_message_by_message) {
  const char *text =
      "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"hello\"}]}\n"
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n"
      "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\"}]}\n"
      "{\"messages\":[]}\n";
  lt_dataset_report_t r = report(text, 3, NULL, LT_ERR_INVALID);
  cr_assert_eq(r.format, LT_DATASET_MESSAGES);
  cr_assert_eq(r.examples, 1);
  cr_assert(strstr(find(&r, 2)->reason, "assistant"));
  cr_assert_str_eq(r.errors[1].field, "messages[0].role");
  cr_assert_str_eq(r.errors[2].field, "messages[1].content");
  cr_assert_str_eq(find(&r, 4)->field, "messages");
}

/* A chat line that also has a prompt and a completion, both strings, was validated as chat (by
 * "messages" alone) while the trainer reads its prompt and completion: it trained on what was not
 * checked. It is refused, naming the line and the fields; one with only one of them, or a null
 * one, is chat for both and stays valid. */
Test(dataset, a_line_with_messages_and_a_prompt_and_completion_is_refused_naming_both) {
  const char *text =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}\n"
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}],"
      "\"prompt\":\"p\",\"completion\":\"c\"}\n"
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}],"
      "\"completion\":\"c\"}\n"
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}],"
      "\"prompt\":\"p\",\"completion\":null}\n";
  lt_dataset_report_t r = report(text, 5, NULL, LT_ERR_INVALID);
  cr_assert_eq(r.examples, 3, "the chat lines are examples");
  cr_assert_eq(r.error_count, 1);
  const lt_dataset_error_t *e = find(&r, 2);
  cr_assert_not_null(e, "line 2 is not refused");
  cr_expect_str_eq(e->field, "messages");
  cr_expect(strstr(e->reason, "\"prompt\"") && strstr(e->reason, "\"completion\"") && strstr(e->reason, "one format"),
            "\"%s\"", e->reason);
}

Test(dataset, openai_message_weights_are_0_or_1_on_assistant_messages_only) {
  const char *text =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"a\",\"weight\":0},"
      "{\"role\":\"user\",\"content\":\"again\"},{\"role\":\"assistant\",\"content\":\"b\",\"weight\":1}]}\n"
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"weight\":1},{\"role\":\"assistant\",\"content\":\"a\"}]}\n"
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"a\",\"weight\":0.5}]}\n"
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"a\",\"weight\":0}]}\n";
  lt_dataset_report_t r = report(text, 7, NULL, LT_ERR_INVALID);
  cr_assert_eq(r.examples, 1, "only the first line is valid, got %llu", (unsigned long long)r.examples);
  cr_assert_str_eq(find(&r, 2)->field, "messages[0].weight");
  cr_assert(strstr(find(&r, 2)->reason, "only assistant messages"));
  cr_assert_str_eq(find(&r, 3)->field, "messages[1].weight");
  cr_assert(strstr(find(&r, 3)->reason, "0 or 1"));
  cr_assert_str_eq(find(&r, 4)->field, "messages");
  cr_assert(strstr(find(&r, 4)->reason, "nothing to learn"));
}

Test(dataset, any_chunking_gives_the_same_report) {
  char text[8192] = "";
  for (int i = 0; i < 60; i++) {
    char line[128];
    snprintf(line, sizeof line, i % 7 == 3 ? "{\"prompt\":\"p%d\"}\n" : "{\"prompt\":\"p%d\",\"completion\":\"c\"}\n", i);
    strcat(text, line);
  }
  lt_dataset_report_t ra = report(text, 1, NULL, LT_ERR_INVALID), rb = report(text, 4096, NULL, LT_ERR_INVALID);
  cr_assert_eq(ra.examples, rb.examples);
  cr_assert_eq(ra.error_count, rb.error_count);
  cr_assert_eq(ra.error_count, 9);
  cr_assert_eq(ra.tokens, rb.tokens);
  for (size_t i = 0; i < ra.errors_kept; i++) cr_assert_eq(ra.errors[i].line, rb.errors[i].line);
}

Test(dataset, file_over_the_byte_quota_stops_with_the_limit_named) {
  lt_dataset_limits_t lim = {.max_bytes = 100};
  lt_dataset_report_t r = report_repeated("{\"prompt\":\"p\",\"completion\":\"c\"}\n", 10, 50, &lim, LT_ERR_QUOTA);
  cr_assert(r.over_quota);
  cr_assert(strstr(r.errors[r.errors_kept - 1].reason, "quota of 100 bytes"));
  cr_assert_leq(r.bytes, 100);
}

/* Found by tests/fuzz/fuzz_dataset: a piece that crossed the quota was refused whole, so lines
 * before it were checked when the body came in small pieces and not when it came in one. */
Test(dataset, quota_report_does_not_depend_on_the_pieces) {
  lt_dataset_limits_t lim = {.max_bytes = 100, .max_errors = 2};
  const char *text = "not json\n{\"prompt\":1}\n[]\n{\"prompt\":\"p\",\"completion\":\"c\"}\n"
                     "{\"prompt\":\"p\",\"completion\":\"c\"}\n{\"prompt\":\"p\",\"completion\":\"c\"}\n";
  lt_dataset_report_t a = report(text, 1, &lim, LT_ERR_QUOTA), b = report(text, 4096, &lim, LT_ERR_QUOTA);
  cr_assert_eq(a.lines, b.lines);
  cr_assert_eq(a.examples, b.examples);
  cr_assert_eq(a.error_count, b.error_count);
  cr_assert_eq(a.bytes, 100);
  cr_assert_eq(b.bytes, 100);
  cr_assert_eq(a.error_count, 5, "four errors on three lines, then the quota: %llu", (unsigned long long)a.error_count);
  /* the kept errors were full: the quota still is the last one, which the API answers with */
  cr_assert_eq(a.errors_kept, 2);
  cr_assert(strstr(a.errors[1].reason, "quota of 100 bytes"), "%s", a.errors[1].reason);
  cr_assert(strstr(b.errors[1].reason, "quota of 100 bytes"), "%s", b.errors[1].reason);
}

Test(dataset, overlong_line_and_empty_file_are_errors) {
  lt_dataset_limits_t lim = {.max_line_bytes = 64};
  const char *text = "{\"prompt\":\"0123456789012345678901234567890123456789012345678901234567890\",\"completion\":\"c\"}\n"
                     "{\"prompt\":\"p\",\"completion\":\"c\"}\n";
  lt_dataset_report_t r = report(text, 5, &lim, LT_ERR_INVALID);
  cr_assert_eq(r.errors[0].line, 1);
  cr_assert(strstr(r.errors[0].reason, "longer than 64 bytes"));
  cr_assert_eq(r.examples, 1);
  r = report("\n\n", 5, NULL, LT_ERR_INVALID);
  cr_assert(strstr(r.errors[0].reason, "no examples"));
}

Test(dataset, error_list_is_capped_but_the_count_is_exact) {
  lt_dataset_limits_t lim = {.max_errors = 5};
  lt_dataset_report_t r = report_repeated("nope\n", 50, 64, &lim, LT_ERR_INVALID);
  cr_assert_eq(r.errors_kept, 5);
  cr_assert_eq(r.error_count, 50);
}

Test(dataset, utf8_validator_refuses_overlongs_and_surrogates) {
  cr_assert(lt_utf8_valid("h\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80", 12, NULL));
  size_t off;
  cr_assert(!lt_utf8_valid("ab\xc0\xaf", 4, &off));
  cr_assert_eq(off, 2);
  cr_assert(!lt_utf8_valid("\xed\xa0\x80", 3, NULL));     /* surrogate */
  cr_assert(!lt_utf8_valid("\xf4\x90\x80\x80", 4, NULL)); /* > U+10FFFF */
  cr_assert(!lt_utf8_valid("\xe6\x97", 2, NULL));         /* truncated */
}

Test(dataset, a_byte_order_mark_and_crlf_line_ends_are_accepted) {
  /* What Notepad writes: a UTF-8 byte-order mark, then CRLF line ends. */
  const char *text = "\xEF\xBB\xBF{\"prompt\":\"a\",\"completion\":\"b\"}\r\n"
                     "{\"prompt\":\"c\",\"completion\":\"d\"}\r\n";
  lt_dataset_report_t r = report(text, 3, NULL, LT_OK);
  cr_expect_eq(r.error_count, 0, "first error: %s", r.errors_kept ? r.errors[0].reason : "");
  cr_expect_eq(r.examples, 2);
  cr_expect_eq(r.format, LT_DATASET_PROMPT_COMPLETION);
  /* Only the file's start may carry one: a mark inside the file is still invalid JSON. */
  r = report("{\"prompt\":\"a\",\"completion\":\"b\"}\n\xEF\xBB\xBF{\"prompt\":\"c\",\"completion\":\"d\"}\n", 5,
             NULL, LT_ERR_INVALID);
  cr_expect_eq(r.examples, 1);
  cr_expect_not_null(find(&r, 2), "line 2 named");
}
