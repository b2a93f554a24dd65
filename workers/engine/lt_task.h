/* lt_task: the bundled base model's pretraining corpus and the fine-tuning task.
 *
 * Everything here is a pure function of a 64-bit seed: the same seed gives the same bytes on
 * every machine (own splitmix64 RNG, no locale, no floating point, no libc rand).
 *
 * Corpus (lt_task_corpus): short English-like documents separated by "<|endoftext|>": stories
 * from a small seeded grammar that mention dates in prose ("on March 5, 2021", "on 5 March
 * 2021"), key=value records with ISO dates ("date=2021-03-05"), calendar facts that tie month
 * names to their numbers ("March is month 03 of the year."), "field: value" cards, arithmetic
 * and lists. It primes a small model with every piece the task needs -- month names, two-digit
 * months and days, ISO dates, the "field: value" line format -- but never pairs a prose date
 * with its ISO form and never uses the task's "iso:" field, so the base model has not seen the
 * task itself.
 *
 * Task "date-iso" (lt_task_dates): convert a prose date to ISO 8601.
 *     prompt      "date: March 5, 2021\niso:"     or "date: 5 March 2021\niso:"
 *     completion  " 2021-03-05"
 * Years 1950-2049, valid days only. Train and eval hold different calendar dates (never the
 * same date in another format), so eval measures the rule, not memory. Score: exact match of
 * the model's greedy output (decoded up to EOS) against the completion, after trimming ASCII
 * whitespace at both ends (lt_task_exact_match).
 *
 * Threads: all functions are reentrant; there is no shared state.
 */
#ifndef LT_TASK_H
#define LT_TASK_H

#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

/* The special tokens of the bundled tokenizer, in id order (ids 0, 1, 2). */
#define LT_TASK_N_SPECIAL 3
extern const char *const lt_task_specials[LT_TASK_N_SPECIAL];

/* Generates about target_bytes of corpus text (whole documents, so a little more) into a new
 * NUL-terminated buffer *out the caller frees with free(). Errors: LT_ERR_NOMEM. */
lt_err_t lt_task_corpus(uint64_t seed, size_t target_bytes, char **out, size_t *out_len,
                        char *errstr, size_t errstr_size);

/* Generates the date-iso task as JSONL, one {"prompt","completion"} object per line: n_train
 * lines into *train and n_eval lines into *eval (new NUL-terminated buffers, caller frees).
 * Errors: LT_ERR_INVALID when n_train + n_eval exceeds the distinct dates (36524), or either
 * is 0; LT_ERR_NOMEM. */
lt_err_t lt_task_dates(uint64_t seed, size_t n_train, size_t n_eval, char **train,
                       size_t *train_len, char **eval, size_t *eval_len, char *errstr,
                       size_t errstr_size);

/* 1 when got equals expected after trimming ASCII whitespace at both ends of each, else 0.
 * The engine decodes the greedy output up to (not including) EOS and passes it as got. */
int lt_task_exact_match(const char *expected, size_t expected_len, const char *got,
                        size_t got_len);

/* The bundled base model's settings: 8 MB of corpus is about 2.3M tokens with the 2048-token
 * vocabulary (3.5 bytes/token); a task example is at most 17 tokens. */
#define LT_TASK_BUNDLE_SEED 1
#define LT_TASK_BUNDLE_CORPUS_BYTES 8000000
#define LT_TASK_BUNDLE_VOCAB 2048
#define LT_TASK_BUNDLE_TRAIN 4000
#define LT_TASK_BUNDLE_EVAL 500

/* Writes the bundle of the base model's data into dir (which must exist):
 *   corpus.txt       lt_task_corpus(seed, corpus_bytes)
 *   tokenizer.json   lt_tok_train(corpus, vocab_size, lt_task_specials)
 *   task_train.jsonl, task_eval.jsonl   lt_task_dates(seed + 1, n_train, n_eval)
 * Existing files are replaced (written to a temporary name, then renamed). Errors: LT_ERR_IO
 * naming the file, and those of the generators. */
lt_err_t lt_task_write_bundle(const char *dir, uint64_t seed, size_t corpus_bytes,
                              int32_t vocab_size, size_t n_train, size_t n_eval, char *errstr,
                              size_t errstr_size);

#endif
