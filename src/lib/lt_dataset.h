/* lt_dataset: validation of customer datasets (JSONL), streamed.
 *
 * An upload is never buffered whole: the API feeds the body chunk by chunk into a checker,
 * which splits lines, validates each and keeps statistics. Formats (one per file):
 *   {"prompt": "...", "completion": "..."}                      prompt/completion
 *   {"messages": [{"role": "system|user|assistant", "content": "..."}, ...]}   chat
 * Every bad line is reported with its line number, the field and the reason (invalid JSON,
 * invalid UTF-8, missing field, wrong type, empty text, example over the token limit, file over
 * the byte quota). Up to max_errors are kept; the count of all errors is always exact.
 *
 * Token counts come from a callback (the tokenizer lives in workers/), so this module stays
 * free of the engine. Pure apart from the callback: no I/O. One thread per checker. */
#ifndef LT_DATASET_H
#define LT_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "lt_err.h"

typedef enum lt_dataset_format {
  LT_DATASET_UNKNOWN = 0, /* no valid line yet */
  LT_DATASET_PROMPT_COMPLETION,
  LT_DATASET_MESSAGES,
} lt_dataset_format_t;

typedef struct lt_dataset_limits {
  uint64_t max_bytes;      /* the tenant's dataset byte quota for this file; 0: no limit */
  size_t max_line_bytes;   /* longest line accepted (0: 1 MiB) */
  int32_t max_tokens;      /* longest example in tokens (the job's max_seq_len); 0: no limit */
  size_t max_errors;       /* errors kept for the report (0: 100) */
} lt_dataset_limits_t;

/* Counts the tokens of one example as training will see it (template included). line is the
 * parsed JSON object, already checked for shape. Returns the count, or -1 when the example
 * cannot be tokenised (the checker reports it on that line). */
typedef int64_t lt_dataset_tokens_fn(void *ctx, lt_dataset_format_t format, const json_t *line);

typedef struct lt_dataset_error {
  uint64_t line;      /* 1-based; 0 for errors about the whole file */
  char field[48];     /* "prompt", "messages[2].content", "" when not about a field */
  char reason[160];
} lt_dataset_error_t;

typedef struct lt_dataset_report {
  lt_dataset_format_t format;
  uint64_t bytes;
  uint64_t lines;          /* lines seen, blank ones included */
  uint64_t examples;       /* valid examples */
  uint64_t tokens;         /* total tokens of valid examples (0 without a tokens_fn) */
  int64_t longest_tokens;  /* longest valid example */
  uint64_t longest_line;   /* its line number */
  uint64_t error_count;    /* every error, even those not kept */
  size_t errors_kept;
  const lt_dataset_error_t *errors; /* errors_kept entries, owned by the checker */
  bool over_quota;         /* stopped reading: the file is over max_bytes */
} lt_dataset_report_t;

typedef struct lt_dataset_check lt_dataset_check_t;

/* A UTF-8 byte-order mark (EF BB BF) at *s is stepped over: true when there was one. Only a
 * file's first line may carry it (editors on Windows write it); the validator and the trainer
 * both call this on line 1, so they read the same examples. */
bool lt_dataset_skip_bom(const char **s, size_t *n);

/* tokens_fn may be NULL (no token checks). The checker owns nothing of the caller's. */
lt_err_t lt_dataset_check_new(lt_dataset_check_t **out, const lt_dataset_limits_t *limits,
                              lt_dataset_tokens_fn *tokens_fn, void *ctx);

/* Feeds the next bytes of the file. Returns LT_ERR_QUOTA once the file is over max_bytes (the
 * caller stops reading and answers 429/413); otherwise LT_OK, whatever the lines' validity. */
lt_err_t lt_dataset_check_feed(lt_dataset_check_t *c, const void *data, size_t len);

/* Ends the file (a last line without a newline counts) and fills *report, which stays valid
 * until the checker is destroyed. LT_OK when the file is valid (at least one example, no
 * errors); LT_ERR_INVALID when it is not (the report says why); LT_ERR_QUOTA when over quota. */
lt_err_t lt_dataset_check_finish(lt_dataset_check_t *c, lt_dataset_report_t *report);

void lt_dataset_check_destroy(lt_dataset_check_t *c);

/* The report as the API shows it (pre-flight report or the list of errors). New reference.
 * cost_token_steps: estimated training cost, tokens x epochs, reported when epochs > 0. */
json_t *lt_dataset_report_json(const lt_dataset_report_t *r, int32_t epochs);

const char *lt_dataset_format_name(lt_dataset_format_t f); /* "prompt_completion" | "messages" */

/* Where a dataset lives in the object store (docs/DESIGN.md §8), one object per leaf:
 *   LT_DATASET_DATA  the JSONL, sealed with the dataset's own data key
 *   LT_DATASET_KEY   that data key, wrapped by the master key for the tenant (delete = shred)
 *   LT_DATASET_META  id, name, sizes, report (sealed); written last: the dataset exists when it does */
#define LT_DATASET_DATA "data.jsonl.lte"
#define LT_DATASET_KEY "key.wrapped"
#define LT_DATASET_META "meta.json.lte"
void lt_dataset_object_key(char *out, size_t out_size, const char *tenant, const char *dataset_id, const char *leaf);

/* True when the n bytes at s are valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). When
 * not, *bad_offset (may be NULL) gets the offset of the first bad byte. */
bool lt_utf8_valid(const char *s, size_t n, size_t *bad_offset);

#endif
