/* Tests of what the API remembers of a tenant's stored bytes (src/control/lt_api_quota.c): measures
 * run side by side on the work pool and end in any order, so the one noted last is not always the
 * newest. The quotas themselves are attacked against the real stack in tests/test_api_data.c. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "lt_api_int.h"

static lt_api_t *api_new(void) {
  lt_api_t *api = calloc(1, sizeof *api);
  cr_assert(api);
  api->stored_bytes = lt_map_new(free);
  cr_assert(api->stored_bytes);
  return api;
}

static void api_free(lt_api_t *api) {
  lt_map_destroy(api->stored_bytes);
  free(api);
}

/* The bytes remembered for tenant t, or -1 when none are. */
static long long known(lt_api_t *api, const char *t) {
  uint64_t bytes;
  return lt_api_stored_recent(api, t, &bytes, NULL) ? (long long)bytes : -1;
}

Test(api_quota, a_measure_begun_before_another_never_replaces_it) {
  lt_api_t *api = api_new();
  uint64_t first = lt_api_stored_mark(api), second = lt_api_stored_mark(api);
  cr_assert_gt(second, first);
  lt_api_stored_note(api, "t1", second, true, 2000);
  lt_api_stored_note(api, "t1", first, true, 1000); /* listed before the other: older */
  cr_assert_eq(known(api, "t1"), 2000);
  lt_api_stored_note(api, "t1", lt_api_stored_mark(api), true, 3000);
  cr_assert_eq(known(api, "t1"), 3000);
  cr_assert_eq(known(api, "t2"), -1, "another tenant's bytes are not this one's");
  lt_api_stored_note(api, "t2", first, true, 50); /* the first of its own */
  cr_assert_eq(known(api, "t2"), 50);
  cr_assert_eq(known(api, "t1"), 3000);
  api_free(api);
}

Test(api_quota, a_change_forgets_every_measure_begun_before_it) {
  lt_api_t *api = api_new();
  lt_api_stored_note(api, "t1", lt_api_stored_mark(api), true, 1000);
  uint64_t before = lt_api_stored_mark(api); /* a measure lists, then a deletion is noted */
  lt_api_stored_note(api, "t1", 0, false, 0);
  cr_assert_eq(known(api, "t1"), -1, "a deleted job's checkpoints: measured again when asked");
  lt_api_stored_note(api, "t1", before, true, 1000);
  cr_assert_eq(known(api, "t1"), -1, "a measure that began before the deletion would count its bytes");
  lt_api_stored_note(api, "t1", lt_api_stored_mark(api), true, 400);
  cr_assert_eq(known(api, "t1"), 400);
  /* a change to a tenant not measured yet holds too */
  uint64_t old = lt_api_stored_mark(api);
  lt_api_stored_note(api, "t3", 0, false, 0);
  lt_api_stored_note(api, "t3", old, true, 7);
  cr_assert_eq(known(api, "t3"), -1);
  api_free(api);
}
