/* lt_err: every error has a distinct name and a sentence; lt_errf formats and returns. */
#include <criterion/criterion.h>
#include <string.h>

#include "lt_err.h"

Test(err, every_code_has_a_distinct_name_and_sentence) {
  for (int i = 0; i < LT_ERR__COUNT; i++) {
    cr_assert_str_neq(lt_err_name((lt_err_t)i), "LT_ERR_?", "code %d has no name", i);
    cr_assert(strlen(lt_err_str((lt_err_t)i)) > 3);
    for (int j = 0; j < i; j++)
      cr_assert_str_neq(lt_err_name((lt_err_t)i), lt_err_name((lt_err_t)j));
  }
  cr_assert_str_eq(lt_err_name((lt_err_t)999), "LT_ERR_?");
}

Test(err, errf_formats_and_returns_the_code) {
  char buf[64];
  lt_err_t e = lt_errf(buf, sizeof buf, LT_ERR_INVALID, "line %d: field \"%s\" is empty", 7, "prompt");
  cr_assert_eq(e, LT_ERR_INVALID);
  cr_assert_str_eq(buf, "line 7: field \"prompt\" is empty");
  cr_assert_eq(lt_errf(NULL, 0, LT_ERR_IO, "x"), LT_ERR_IO);
}
