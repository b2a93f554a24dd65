/* fuzz_dataset: the streamed JSONL validator of uploads (lt_dataset_check_*), fed the way the
 * API feeds it: a body in pieces of whatever size the connection delivered.
 *
 * First 4 bytes: piece size, line limit, error limit and byte quota (small, so that the limits
 * are reached); the rest is the file. A token counter stands in for the tokenizer (a function of
 * the parsed line, refusing some).
 * Property: the report does not depend on where the pieces were cut (the file fed whole gives
 * the same result, counts and kept errors), and every count is consistent (examples <= lines,
 * errors kept <= the limit and <= the count). */
#include <string.h>

#include "fuzz.h"
#include "lt_dataset.h"

/* Tokens of a line: its JSON size, -1 when it holds a key "untokenizable". */
static int64_t count_tokens(void *ctx, lt_dataset_format_t format, const json_t *line) {
  (void)ctx;
  if (json_object_get(line, "untokenizable")) return -1;
  char *s = json_dumps(line, JSON_COMPACT);
  int64_t n = s ? (int64_t)strlen(s) / 4 + (format == LT_DATASET_MESSAGES) : -1;
  free(s);
  return n;
}

typedef struct {
  lt_err_t feed_err, finish_err;
  lt_dataset_report_t r;
  lt_dataset_error_t errors[8];
} result_t;

static void check(const lt_dataset_limits_t *lim, const uint8_t *data, size_t size, size_t piece,
                  result_t *out) {
  lt_dataset_check_t *c = NULL;
  FUZZ_CHECK(lt_dataset_check_new(&c, lim, count_tokens, NULL) == LT_OK, "check_new failed");
  memset(out, 0, sizeof *out);
  for (size_t off = 0; off < size && !out->feed_err; off += piece)
    out->feed_err = lt_dataset_check_feed(c, data + off, size - off < piece ? size - off : piece);
  out->finish_err = lt_dataset_check_finish(c, &out->r);
  const lt_dataset_report_t *r = &out->r;
  FUZZ_CHECK(r->examples <= r->lines && r->errors_kept <= r->error_count &&
                 r->errors_kept <= lim->max_errors && r->bytes <= size,
             "inconsistent report: lines %llu examples %llu errors %llu kept %zu bytes %llu of %zu",
             (unsigned long long)r->lines, (unsigned long long)r->examples,
             (unsigned long long)r->error_count, r->errors_kept, (unsigned long long)r->bytes, size);
  FUZZ_CHECK((out->finish_err == LT_OK) == (r->examples > 0 && r->error_count == 0 && !r->over_quota),
             "finish says %d with %llu examples and %llu errors", out->finish_err,
             (unsigned long long)r->examples, (unsigned long long)r->error_count);
  for (size_t i = 0; i < r->errors_kept; i++) {
    FUZZ_CHECK(memchr(r->errors[i].field, 0, sizeof r->errors[i].field) &&
                   memchr(r->errors[i].reason, 0, sizeof r->errors[i].reason) && r->errors[i].line <= r->lines,
               "error %zu is not terminated or names line %llu of %llu", i, (unsigned long long)r->errors[i].line,
               (unsigned long long)r->lines);
    if (i < 8) out->errors[i] = r->errors[i];
  }
  json_t *j = lt_dataset_report_json(r, 2);
  FUZZ_CHECK(j != NULL, "the report has no JSON form");
  json_decref(j);
  out->r.errors = NULL;
  lt_dataset_check_destroy(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t piece = 1 + fuzz_take(&data, &size) % 64;
  lt_dataset_limits_t lim = {
      .max_line_bytes = 1 + (size_t)fuzz_take(&data, &size) * 8,
      .max_errors = 1 + fuzz_take(&data, &size) % 8,
  };
  uint8_t q = fuzz_take(&data, &size);
  lim.max_bytes = q < 128 ? 0 : (uint64_t)(q - 128) * 16;
  lim.max_tokens = (int32_t)(q % 64);
  result_t a, b;
  check(&lim, data, size, piece, &a);
  check(&lim, data, size, size ? size : 1, &b);
  FUZZ_CHECK(a.feed_err == b.feed_err && a.finish_err == b.finish_err && a.r.format == b.r.format &&
                 a.r.bytes == b.r.bytes && a.r.lines == b.r.lines && a.r.examples == b.r.examples &&
                 a.r.tokens == b.r.tokens && a.r.longest_tokens == b.r.longest_tokens &&
                 a.r.longest_line == b.r.longest_line && a.r.error_count == b.r.error_count &&
                 a.r.errors_kept == b.r.errors_kept && a.r.over_quota == b.r.over_quota,
             "the report depends on the piece size %zu: lines %llu/%llu examples %llu/%llu errors %llu/%llu", piece,
             (unsigned long long)a.r.lines, (unsigned long long)b.r.lines, (unsigned long long)a.r.examples,
             (unsigned long long)b.r.examples, (unsigned long long)a.r.error_count,
             (unsigned long long)b.r.error_count);
  for (size_t i = 0; i < a.r.errors_kept && i < 8; i++)
    FUZZ_CHECK(a.errors[i].line == b.errors[i].line && strcmp(a.errors[i].field, b.errors[i].field) == 0 &&
                   strcmp(a.errors[i].reason, b.errors[i].reason) == 0,
               "error %zu depends on the piece size: %s / %s", i, a.errors[i].reason, b.errors[i].reason);
  return 0;
}
