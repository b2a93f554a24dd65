/* fuzz_tokenizer: a base model's tokenizer.json (lt_tok_load_json: vocabulary, added tokens,
 * merges, pre-tokenizer and decoder), then the loaded tokenizer on text (lt_tok_encode with and
 * without special tokens, lt_tok_decode, a dataset line through lt_tok_encode_json_line).
 *
 * Input: the tokenizer.json up to the first NUL byte; after it, up to 512 bytes of text (a
 * fixed sentence when there is no NUL).
 * Properties: every id encoded is one the tokenizer has; decoding what was encoded gives the
 * text back, byte for byte, when the vocabulary has a token for every byte of the text (else,
 * as in Hugging Face's tokenizers, a byte without one becomes the unknown token or is dropped);
 * an accepted tokenizer loads a second time. */
#include <string.h>

#include "fuzz.h"
#include "lt_tok.h"
#include "lt_tok_int.h" /* byte_id: which bytes have a token */

static void check_text(const lt_tok_t *tok, const char *text, size_t len) {
  char err[256];
  int32_t vocab = lt_tok_vocab_size(tok);
  for (int flags = 0; flags <= LT_TOK_SPECIAL; flags++) {
    lt_tok_seq_t seq;
    lt_tok_seq_init(&seq);
    if (lt_tok_encode(tok, text, len, flags, 1.0f, &seq, err, sizeof err) == LT_OK) {
      for (size_t i = 0; i < seq.len; i++)
        FUZZ_CHECK(seq.ids[i] >= 0 && seq.ids[i] < vocab && lt_tok_token_str(tok, seq.ids[i]),
                   "encoded id %d at %zu is not the tokenizer's (vocab %d)", seq.ids[i], i, vocab);
      int unknown = 0;
      for (size_t i = 0; i < len; i++) unknown |= tok->byte_id[(uint8_t)text[i]] < 0;
      char *out = NULL;
      size_t out_len = 0;
      lt_err_t e = lt_tok_decode(tok, seq.ids, seq.len, 0, &out, &out_len, err, sizeof err);
      FUZZ_CHECK(e == LT_OK, "what was encoded does not decode: %s", err);
      if (!unknown)
        FUZZ_CHECK(out_len == len && memcmp(out, text, len) == 0,
                   "decode(encode(text)) differs (flags %d): %zu bytes back of %zu", flags, out_len, len);
      free(out);
    }
    lt_tok_seq_free(&seq);
  }
  lt_tok_seq_t seq;
  lt_tok_seq_init(&seq);
  (void)lt_tok_encode_json_line(tok, text, len, &seq, err, sizeof err);
  lt_tok_seq_free(&seq);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char sentence[] = "Hello, world! It's 2026-12-03: h\xc3\xa9llo <|im_end|>\n  42";
  const uint8_t *nul = memchr(data, 0, size);
  size_t jlen = nul ? (size_t)(nul - data) : size;
  const char *text = nul ? (const char *)nul + 1 : sentence;
  size_t tlen = nul ? size - jlen - 1 : sizeof sentence - 1;
  if (tlen > 512) tlen = 512;
  lt_tok_t *tok = NULL;
  char err[512];
  if (lt_tok_load_json((const char *)data, jlen, &tok, err, sizeof err) == LT_OK) {
    lt_tok_t *again = NULL;
    FUZZ_CHECK(lt_tok_load_json((const char *)data, jlen, &again, err, sizeof err) == LT_OK &&
                   lt_tok_vocab_size(again) == lt_tok_vocab_size(tok),
               "an accepted tokenizer.json does not load the same twice: %s", err);
    lt_tok_destroy(again);
    char *copy = malloc(tlen ? tlen : 1); /* exactly the text: an overread is seen */
    memcpy(copy, text, tlen);
    check_text(tok, copy, tlen);
    free(copy);
  } else {
    FUZZ_CHECK(tok == NULL && err[0], "refused without a message, or with a tokenizer");
  }
  lt_tok_destroy(tok);
  return 0;
}
