/* test_chat: chat templates (src/lib/lt_chat.h) rendered byte for byte as the reference peer
 * @huggingface/jinja renders them (tests/reference/chat_render.mjs), for the published templates
 * of SmolLM2, Qwen2, Qwen2.5, Llama-3, Mistral-Instruct and Zephyr plus one template of the
 * constructs they do not reach; tokenizer_config.json reading; and templates that must fail
 * with a message naming the construct, its line and column — never a crash or a runaway.
 *
 * The expected outputs are committed (tests/data/chat_templates/expected.json) so this test
 * needs no node; the meson test chat_reference (tests/chat_reference.py) regenerates them live
 * and points LATHE_CHAT_EXPECTED at the fresh file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_chat.h"
#include "lt_test.h"

static char *slurp_rel(const char *rel) {
  char path[1024];
  char *s = lt_test_slurp(lt_test_source_path(rel, path, sizeof path), NULL);
  cr_assert_not_null(s, "cannot read %s", path);
  return s;
}

static json_t *load_json(const char *path) {
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  cr_assert_not_null(j, "%s: line %d: %s", path, je.line, je.text);
  return j;
}

/* Renders with a one-message conversation; returns the error and the output or message. */
static lt_err_t render1(const char *tmpl, char **out, char *err, size_t n) {
  json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "Hello");
  *out = NULL;
  lt_err_t e = lt_chat_render(tmpl, msgs, true, "<s>", "</s>", out, err, n);
  json_decref(msgs);
  return e;
}

static void expect_ok(const char *tmpl, const char *want) {
  char *out, err[512] = "";
  lt_err_t e = render1(tmpl, &out, err, sizeof err);
  cr_assert_eq(e, LT_OK, "%s: %s", tmpl, err);
  cr_expect_str_eq(out, want, "template %s: got \"%s\"", tmpl, out);
  free(out);
}

static void expect_fail(const char *tmpl, lt_err_t want, const char *msg) {
  char *out, err[512] = "";
  lt_err_t e = render1(tmpl, &out, err, sizeof err);
  cr_expect_eq(e, want, "%s: got %s (%s)", tmpl, lt_err_name(e), err);
  cr_expect(strstr(err, msg) != NULL, "%s: message \"%s\" lacks \"%s\"", tmpl, err, msg);
  cr_expect_null(out);
  free(out);
}

Test(chat, published_templates_render_as_the_reference_does) {
  char cases_path[1024], exp_path[1024];
  lt_test_source_path("tests/data/chat_templates/cases.json", cases_path, sizeof cases_path);
  const char *env = getenv("LATHE_CHAT_EXPECTED");
  if (env && *env) snprintf(exp_path, sizeof exp_path, "%s", env);
  else lt_test_source_path("tests/data/chat_templates/expected.json", exp_path, sizeof exp_path);
  json_t *cases = load_json(cases_path), *expected = load_json(exp_path);
  cr_assert_eq(json_array_size(cases), json_array_size(expected), "%s and %s differ in length",
               cases_path, exp_path);
  size_t ok = 0, raised = 0;
  for (size_t i = 0; i < json_array_size(cases); i++) {
    json_t *c = json_array_get(cases, i), *x = json_array_get(expected, i);
    const char *name = json_string_value(json_object_get(c, "name"));
    cr_assert_str_eq(json_string_value(json_object_get(x, "name")), name);
    char rel[512];
    snprintf(rel, sizeof rel, "tests/data/chat_templates/%s",
             json_string_value(json_object_get(c, "template")));
    char *tmpl = slurp_rel(rel), *out = NULL, err[512] = "";
    lt_err_t e = lt_chat_render(tmpl, json_object_get(c, "messages"),
                                json_is_true(json_object_get(c, "add_generation_prompt")),
                                json_string_value(json_object_get(c, "bos_token")),
                                json_string_value(json_object_get(c, "eos_token")), &out, err,
                                sizeof err);
    const char *want = json_string_value(json_object_get(x, "output"));
    const char *want_err = json_string_value(json_object_get(x, "error"));
    if (want) {
      cr_expect_eq(e, LT_OK, "%s: %s", name, err);
      if (e == LT_OK) cr_expect_str_eq(out, want, "%s: rendered differently", name);
      ok += e == LT_OK && !strcmp(out, want);
    } else {
      /* the reference raised: the template's own raise_exception message must surface */
      cr_assert_not_null(want_err, "%s: expected.json has neither output nor error", name);
      cr_expect_eq(e, LT_ERR_INVALID, "%s: want raise_exception, got %s", name, lt_err_name(e));
      cr_expect(strstr(err, want_err) != NULL, "%s: \"%s\" lacks \"%s\"", name, err, want_err);
      raised++;
    }
    free(out);
    free(tmpl);
  }
  cr_expect_gt(ok, 40, "only %zu cases rendered", ok);
  cr_expect_gt(raised, 0, "no case exercised raise_exception");
  json_decref(cases);
  json_decref(expected);
}

Test(chat, whitespace_control_and_block_trimming_follow_transformers) {
  expect_ok("  {% if true %}\nA\n  {% endif %}\nB", "A\nB");      /* lstrip + trim blocks */
  expect_ok("x  {%- if true -%}  \n y {%- endif %}", "xy");
  expect_ok("{{ 'a' }}\n{{- ' b ' -}}\n c", "a b c");
  expect_ok("{# note #}\nA {#- x -#} B\n", "AB");                    /* one trailing \n dropped */
  expect_ok("  {{ 'keep' }}  \n", "  keep  ");
}

Test(chat, scoping_namespace_and_loops) {
  expect_ok("{% set x = 1 %}{% for m in messages %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
            "21");
  expect_ok("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}"
            "{% endfor %}{{ ns.n }}", "6");
  expect_ok("{% for i in [5,6,7] %}{{ loop.index }}{{ loop.index0 }}{{ loop.length }}"
            "{{ 'F' if loop.first }}{{ 'L' if loop.last }},{% endfor %}", "103F,213,323L,");
  expect_ok("{% for i in [] %}x{% else %}empty{% endfor %}", "empty");
  expect_ok("{% for i in nothing %}x{% endfor %}{{ nothing }}|{{ 'f' if not nothing }}", "|f");
  expect_ok("{{ [1,2,3,4][::-1] | join(',') }}|{{ 'héllo'[1:3] }}|{{ -7 % 3 }}|{{ -7 // 2 }}",
            "4,3,2,1|él|2|-4");
  expect_ok("{{ true }}{{ none }}{{ 3 }}", "TrueNone3"); /* Python's spelling, as transformers */
}

/* tojson as transformers' json.dumps(ensure_ascii=False) and @huggingface/jinja print it. */
Test(chat, tojson_matches_python_separators) {
  expect_ok("{{ {'a': 1, 'b': [1, 'x', none, true]} | tojson }}",
            "{\"a\": 1, \"b\": [1, \"x\", null, true]}");
  expect_ok("{{ {'a': 1} | tojson(indent=2) }}", "{\n  \"a\": 1\n}");
  expect_ok("{{ '\u00e9\"\\n' | tojson }}", "\"\u00e9\\\"\\n\"");
}

Test(chat, unsupported_or_broken_templates_fail_with_line_and_column) {
  expect_fail("ab\n  {{ messages", LT_ERR_INVALID, "line 2, column 3: unterminated tag '{{'");
  expect_fail("{% if true %}x", LT_ERR_INVALID, "block not closed: no '{% endif %}'");
  expect_fail("{{ 'abc }}", LT_ERR_INVALID, "line 1, column 4: unterminated string literal");
  expect_fail("{# open", LT_ERR_INVALID, "unterminated comment");
  expect_fail("\n{{ x | frobnicate }}", LT_ERR_UNSUPPORTED,
              "line 2, column 8: unknown filter \"frobnicate\"");
  expect_fail("{{ x is weird }}", LT_ERR_UNSUPPORTED, "unknown test \"weird\"");
  expect_fail("{% macro m() %}{% endmacro %}", LT_ERR_UNSUPPORTED,
              "'{% macro %}' is not supported");
  expect_fail("{% endfor %}", LT_ERR_INVALID, "'{% endfor %}' is not inside a block");
  expect_fail("{{ 1.5 }}", LT_ERR_UNSUPPORTED, "floating-point literals are not supported");
  expect_fail("{{ lipsum() }}", LT_ERR_UNSUPPORTED, "unknown function \"lipsum\"");
  expect_fail("{{ 'a'.zfill(3) }}", LT_ERR_UNSUPPORTED, "unknown method \"zfill\" of string");
  expect_fail("{{ 1 // 0 }}", LT_ERR_INVALID, "division by zero");
  expect_fail("{{ 'a' + 1 }}", LT_ERR_INVALID, "cannot apply '+' to string and integer");
  expect_fail("{% set x = 1 %}{% set x.y = 2 %}", LT_ERR_INVALID, "not a namespace()");
  expect_fail("\n\n   {{ raise_exception('roles must alternate') }}", LT_ERR_INVALID,
              "line 3, column 7: raise_exception: roles must alternate");
}

Test(chat, runaway_templates_are_bounded) {
  expect_fail("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
              LT_ERR_INVALID, "evaluation steps: the template runs away");
  expect_fail("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}"
              "{% set ns.s = ns.s + ns.s %}{% endfor %}", LT_ERR_INVALID,
              "output over 1048576 bytes");
  expect_fail("{% for i in range(30) %}{{ messages[0].content * 100000 }}{% endfor %}",
              LT_ERR_INVALID, "output over 1048576 bytes");
  expect_fail("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
              "{% endfor %}", LT_ERR_INVALID, "list over 100000 items");
  expect_fail("{{ '' * 999999999999999999 }}{% for i in range(1000000) %}{% endfor %}",
              LT_ERR_INVALID, "range() over 100000 items");
  /* bounds whose difference overflows: before, the check passed and the loop ran until memory
   * ran out */
  expect_fail("{% for i in range(0 - 999999999999999999 * 9, 999999999999999999 * 9) %}{% endfor %}",
              LT_ERR_INVALID, "range() over 100000 items");
  /* deep nesting is refused at parse time instead of exhausting the stack */
  size_t depth = 5000;
  char *deep = malloc(depth * 2 + 16);
  cr_assert_not_null(deep);
  strcpy(deep, "{{ ");
  for (size_t i = 0; i < depth; i++) strcat(deep + 3 + i, "(");
  strcat(deep, "1");
  for (size_t i = 0; i < depth; i++) strcat(deep, ")");
  strcat(deep, " }}");
  expect_fail(deep, LT_ERR_UNSUPPORTED, "nested too deeply");
  char *blocks = malloc(depth * 14 + 8);
  cr_assert_not_null(blocks);
  blocks[0] = '\0';
  for (size_t i = 0; i < depth; i++) strcat(blocks + i * 13, "{% if true %}");
  expect_fail(blocks, LT_ERR_UNSUPPORTED, "blocks nested too deeply");
  free(deep);
  free(blocks);
  /* a run of signs and a chain of elifs nest as deeply: before, both overflowed the stack */
  size_t signs = 50000;
  char *neg = malloc(signs + 16);
  cr_assert_not_null(neg);
  memcpy(neg, "{{ ", 3);
  memset(neg + 3, '-', signs);
  strcpy(neg + 3 + signs, "1 }}");
  expect_fail(neg, LT_ERR_UNSUPPORTED, "nested too deeply");
  free(neg);
  size_t elifs = 150000, el = strlen("{% elif 0 %}");
  char *chain = malloc(elifs * el + 32);
  cr_assert_not_null(chain);
  strcpy(chain, "{% if 0 %}");
  for (size_t i = 0; i < elifs; i++) memcpy(chain + 10 + i * el, "{% elif 0 %}", el);
  strcpy(chain + 10 + elifs * el, "{% endif %}");
  expect_fail(chain, LT_ERR_UNSUPPORTED, "blocks nested too deeply");
  free(chain);
  /* so do chains of one operator, each of which evaluates one level deeper: + ~ and | . */
  static const char *const links[] = {" + 1", " ~ 'x'", " and 1", " | trim", ".x"};
  for (size_t k = 0; k < sizeof links / sizeof *links; k++) {
    size_t count = 200000, ll = strlen(links[k]);
    char *t = malloc(count * ll + 16);
    cr_assert_not_null(t);
    strcpy(t, "{{ 1");
    for (size_t i = 0; i < count; i++) memcpy(t + 4 + i * ll, links[k], ll);
    strcpy(t + 4 + count * ll, " }}");
    expect_fail(t, LT_ERR_UNSUPPORTED, "nested too deeply");
    free(t);
  }
  expect_ok("{{ 1 + 1 + 1 + 1 }}{{ 'a' ~ 'b' ~ 'c' }}{{ ' x ' | trim | upper }}", "4abcX");
  /* negating the least integer wraps, as + and * do (Jinja's integers are unbounded; these are
   * 64-bit): no undefined behaviour */
  expect_ok("{% set m = 2147483648 * 2147483648 * 2 %}{{ m }} {{ -m }} {{ m // -1 }}",
            "-9223372036854775808 -9223372036854775808 -9223372036854775808");
  /* every truncation of a real template fails cleanly or renders */
  char *qwen = slurp_rel("tests/data/chat_templates/qwen2.5.jinja");
  for (size_t n = 0; n < strlen(qwen); n += 7) {
    char *t = strndup(qwen, n), *out = NULL, err[256];
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "Hi");
    lt_err_t e = lt_chat_render(t, msgs, true, NULL, NULL, &out, err, sizeof err);
    cr_expect(e == LT_OK || strstr(err, "chat template line ") != NULL, "prefix %zu: %s", n, err);
    free(out);
    free(t);
    json_decref(msgs);
  }
  free(qwen);
}

Test(chat, messages_must_be_role_and_string_content) {
  char *out = NULL, err[256] = "";
  json_t *m = json_pack("[{s:s, s:s}, {s:s, s:[{s:s}]}]", "role", "user", "content", "hi", "role",
                        "user", "content", "type", "text");
  cr_expect_eq(lt_chat_render("{{ 1 }}", m, false, NULL, NULL, &out, err, sizeof err),
               LT_ERR_INVALID);
  cr_expect_str_eq(err, "messages[1].content is not a string");
  cr_expect_null(out);
  json_decref(m);
  m = json_pack("{s:s}", "role", "user");
  cr_expect_eq(lt_chat_render("x", m, false, NULL, NULL, &out, err, sizeof err), LT_ERR_INVALID);
  cr_expect_str_eq(err, "messages is not an array");
  json_decref(m);
}

Test(chat, tokenizer_config_gives_template_and_tokens) {
  const char *cfg = "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": "
                    "\"</s>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                    "{\"name\": \"default\", \"template\": \"{{ bos_token }}D\"}]}";
  char *t = NULL, *b = NULL, *e = NULL, err[256] = "";
  cr_assert_eq(lt_chat_config_parse(cfg, strlen(cfg), &t, &b, &e, err, sizeof err), LT_OK, "%s",
               err);
  cr_expect_str_eq(t, "{{ bos_token }}D");
  cr_expect_str_eq(b, "<s>");
  cr_expect_str_eq(e, "</s>");
  free(t); free(b); free(e);
  const char *plain = "{\"chat_template\": \"X\"}";
  cr_assert_eq(lt_chat_config_parse(plain, strlen(plain), &t, &b, &e, err, sizeof err), LT_OK);
  cr_expect_str_eq(t, "X");
  cr_expect_str_eq(b, "");
  free(t); free(b); free(e);
  const char *none = "{\"eos_token\": \"</s>\"}";
  cr_expect_eq(lt_chat_config_parse(none, strlen(none), &t, &b, &e, err, sizeof err),
               LT_ERR_NOT_FOUND);
  cr_expect(strstr(err, "no chat_template") != NULL, "%s", err);
  cr_expect_eq(lt_chat_config_parse("{", 1, &t, &b, &e, err, sizeof err), LT_ERR_INVALID);
}

/* Mutated real templates (a byte replaced by template punctuation, deleted or duplicated) render
 * or fail with a positioned message: never a crash, a hang or an unpositioned error. */
Test(chat, mutated_templates_fail_cleanly) {
  static const char *names[] = {"smollm2", "qwen2.5", "llama3", "mistral", "zephyr", "constructs"};
  static const char punct[] = "{}%#-()[]'\"|.,:=+~ \n\\aZ09";
  unsigned long long rng = 0x9e3779b97f4a7c15ULL;
  json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "Hi?", "role",
                           "assistant", "content", "Hello");
  for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/chat_templates/%s.jinja", names[k]);
    char *src = slurp_rel(rel);
    size_t n = strlen(src);
    for (int round = 0; round < 400; round++) {
      char *t = malloc(n + 8), *out = NULL, err[256] = "";
      cr_assert_not_null(t);
      memcpy(t, src, n + 1);
      for (int m = 0; m < 1 + round % 3; m++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t len = strlen(t), at = len ? (size_t)(rng >> 33) % len : 0;
        int how = (int)((rng >> 20) % 3);
        if (how == 0) t[at] = punct[(rng >> 40) % (sizeof punct - 1)];
        else if (how == 1) memmove(t + at, t + at + 1, len - at);
        else { memmove(t + at + 1, t + at, len - at + 1); }
      }
      lt_err_t e = lt_chat_render(t, msgs, round % 2, "<s>", "</s>", &out, err, sizeof err);
      cr_expect(e == LT_OK || !strncmp(err, "chat template line ", 19), "%s round %d: %s (%s)",
                names[k], round, lt_err_name(e), err);
      cr_expect(e == LT_OK ? out != NULL : out == NULL);
      free(out);
      free(t);
    }
    free(src);
  }
  json_decref(msgs);
}
