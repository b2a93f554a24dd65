/* lt_tok: byte-level BPE tokenizer of the training engine (docs/DESIGN.md §7).
 *
 * Loads a Hugging Face `tokenizer.json` (model BPE with vocab and merges in either the
 * "a b" or the ["a","b"] form; ByteLevel pre-tokenizer with the GPT-2 split regex, or a
 * Sequence of Split(regex)/Digits steps followed by ByteLevel; added tokens such as
 * <|endoftext|>, <|im_start|>, <|im_end|> kept whole), encodes bytes to token ids, decodes ids
 * back to bytes, builds training sequences with per-token loss weights from the dataset
 * formats (chat `messages` and `prompt`/`completion`), and trains a small byte-level BPE
 * vocabulary deterministically (used for the bundled base model).
 *
 * Not supported (load fails with LT_ERR_UNSUPPORTED naming the field): normalizers, models
 * other than BPE, byte_fallback, BPE dropout, subword prefixes/suffixes, Split behaviours other
 * than Isolated/Removed. Added tokens' lstrip/rstrip trim ASCII whitespace; single_word is
 * ignored. Unicode classes (\p{L}, \p{N}, \s) come from the system PCRE2 (10.42: Unicode 14),
 * so characters assigned in later Unicode versions may split differently from HF.
 *
 * Encoding is exact for any byte string, valid UTF-8 or not: bytes that are not valid UTF-8
 * become their own pre-tokens and map to byte tokens, so decode(encode(s)) == s whenever the
 * vocabulary holds the 256 byte tokens.
 *
 * The chat template (ChatML), kept simple on purpose:
 *
 *     <|im_start|>{role}\n{content}<|im_end|>\n      for every message, in order
 *     <|im_start|>assistant\n                         appended when add_generation_prompt
 *
 * Each part is encoded on its own (so a message boundary never changes how content is split).
 * Content is encoded with added tokens NOT recognised: a customer's text that spells
 * "<|im_end|>" cannot forge a turn boundary; it becomes ordinary byte-level tokens.
 * Weights: 1 for the tokens of an assistant message's content and its closing <|im_end|>
 * (the model must learn to stop), 0 for everything else (headers, other roles, the "\n"
 * separators).
 *
 * Prompt/completion: encode(prompt) with weight 0, encode(completion) with weight 1, then the
 * end-of-sequence token (lt_tok_eos_id) with weight 1 when the vocabulary has one.
 *
 * Threads: a loaded lt_tok_t is immutable; every function taking a const lt_tok_t * may be
 * called from any number of threads at once. An lt_tok_seq_t belongs to one thread at a time.
 */
#ifndef LT_TOK_H
#define LT_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

typedef struct lt_tok lt_tok_t;

/* A token sequence being built. Plain struct owned by the caller: zero it (or call
 * lt_tok_seq_init), pass it to the encode functions (which append), release it with
 * lt_tok_seq_free. ids[i] is the token, weights[i] its loss weight (0 or 1). */
typedef struct lt_tok_seq {
  int32_t *ids;
  float *weights;
  size_t len;
  size_t cap;
} lt_tok_seq_t;

void lt_tok_seq_init(lt_tok_seq_t *seq);
void lt_tok_seq_free(lt_tok_seq_t *seq); /* frees the arrays and zeroes seq */
static inline void lt_tok_seq_reset(lt_tok_seq_t *seq) { seq->len = 0; }

/* Loads a tokenizer from the tokenizer.json at path. On success *out is a new tokenizer the
 * caller frees with lt_tok_destroy. Errors: LT_ERR_IO (file), LT_ERR_INVALID (malformed JSON or a
 * field of the wrong type: the message names the JSON path, e.g. `model.merges[12]`, and what
 * was expected), LT_ERR_UNSUPPORTED (well-formed but a component Lathe does not implement,
 * e.g. a normalizer or a WordPiece model). */
lt_err_t lt_tok_load_file(const char *path, lt_tok_t **out, char *errstr, size_t errstr_size);

/* The same from a tokenizer.json held in memory (len bytes, need not be NUL-terminated). */
lt_err_t lt_tok_load_json(const char *json, size_t len, lt_tok_t **out, char *errstr,
                          size_t errstr_size);

void lt_tok_destroy(lt_tok_t *tok); /* NULL is fine */

/* Number of ids: one more than the largest id of the vocabulary and the added tokens. The
 * model's embedding must have at least this many rows. */
int32_t lt_tok_vocab_size(const lt_tok_t *tok);

/* Id of a token given as its vocabulary string (byte-level form, e.g. "Ġthe") or as an added
 * token's content ("<|im_end|>"); -1 when there is none. */
int32_t lt_tok_token_id(const lt_tok_t *tok, const char *token);

/* Vocabulary string of id (NUL-terminated, owned by tok) or NULL when id is unassigned. */
const char *lt_tok_token_str(const lt_tok_t *tok, int32_t id);

/* 1 when id is an added token marked special (e.g. <|endoftext|>), else 0. */
int lt_tok_is_special(const lt_tok_t *tok, int32_t id);

/* End-of-sequence id: <|endoftext|>, else </s>, else <|im_end|>; -1 when none exists. */
int32_t lt_tok_eos_id(const lt_tok_t *tok);

/* Flags of lt_tok_encode. */
enum {
  LT_TOK_SPECIAL = 1, /* recognise special added tokens written in the text (as HF does) */
};

/* Appends the tokens of text[0..len) to seq, each with the given weight. Non-special added
 * tokens are always recognised; special ones only with LT_TOK_SPECIAL. Errors: LT_ERR_NOMEM. */
lt_err_t lt_tok_encode(const lt_tok_t *tok, const char *text, size_t len, int flags, float weight,
                       lt_tok_seq_t *seq, char *errstr, size_t errstr_size);

/* Decodes ids to bytes into a new buffer *out (NUL-terminated for convenience, *out_len
 * excludes the NUL) the caller frees with free(). skip_special drops special added tokens.
 * Errors: LT_ERR_INVALID when an id is out of range or unassigned (the message gives its
 * position), LT_ERR_NOMEM. */
lt_err_t lt_tok_decode(const lt_tok_t *tok, const int32_t *ids, size_t n, int skip_special,
                       char **out, size_t *out_len, char *errstr, size_t errstr_size);

/* One chat message. content need not be NUL-terminated. */
typedef struct lt_tok_msg {
  const char *role;    /* "system", "user", "assistant" or another [a-z_]+ name */
  const char *content;
  size_t content_len;
  bool no_loss;        /* an assistant message with "weight": 0: context, not learned */
} lt_tok_msg_t;

/* Appends the ChatML encoding of msgs (see the top of this file) with weights. Errors:
 * LT_ERR_UNSUPPORTED when the vocabulary lacks <|im_start|> or <|im_end|>, LT_ERR_INVALID for a
 * role that is empty or not [a-z_]+ (the message names msgs[i].role). */
lt_err_t lt_tok_encode_chat(const lt_tok_t *tok, const lt_tok_msg_t *msgs, size_t n,
                            int add_generation_prompt, lt_tok_seq_t *seq, char *errstr,
                            size_t errstr_size);

/* Appends prompt (weight 0), completion (weight 1) and the EOS token (weight 1, when there is
 * one). */
lt_err_t lt_tok_encode_prompt_completion(const lt_tok_t *tok, const char *prompt,
                                         size_t prompt_len, const char *completion,
                                         size_t completion_len, lt_tok_seq_t *seq,
                                         char *errstr, size_t errstr_size);

/* Appends the training sequence of one dataset line: a JSON object that is either
 * {"messages":[{"role":..,"content":..},..]} or {"prompt":..,"completion":..}. Errors
 * (LT_ERR_INVALID) name the field and what was expected, e.g.
 * `messages[2].content: expected a string`. */
lt_err_t lt_tok_encode_json_line(const lt_tok_t *tok, const char *line, size_t len,
                                 lt_tok_seq_t *seq, char *errstr, size_t errstr_size);

/* Trains a byte-level BPE tokenizer on text[0..len) and returns its tokenizer.json in a new
 * NUL-terminated buffer *json_out (caller frees with free()).
 *   - ids 0..n_special-1 are the added special tokens, in the order given;
 *   - the next 256 ids are the byte tokens, in byte order;
 *   - then one token per merge until vocab_size ids exist, or no pair occurs twice.
 * Pre-tokenization is the GPT-2 regex, as at encode time. Merges pick the most frequent
 * adjacent pair; ties go to the pair with the smallest (left id, right id). The result depends
 * only on the arguments: same text and settings give the same bytes on every machine.
 * Errors: LT_ERR_INVALID when vocab_size < n_special + 256 (names it), LT_ERR_NOMEM. */
lt_err_t lt_tok_train(const char *text, size_t len, int32_t vocab_size,
                      const char *const *specials, size_t n_special, char **json_out,
                      char *errstr, size_t errstr_size);

#endif
