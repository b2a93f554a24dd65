/* lt_map: keys are found after inserts, replacements, deletes and growth; iteration follows
 * insertion order; colliding keys stay reachable when one between them is deleted. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_map.h"

static int freed;
static void count_free(void *v) {
  freed++;
  free(v);
}

static int *boxed(int v) {
  int *p = malloc(sizeof *p);
  *p = v;
  return p;
}

Test(map, insert_get_replace_and_delete) {
  lt_map_t *m = lt_map_new(NULL);
  cr_assert_not_null(m);
  int a = 1, b = 2, c = 3;
  cr_assert_eq(lt_map_set(m, "alpha", &a), LT_OK);
  cr_assert_eq(lt_map_set(m, "beta", &b), LT_OK);
  cr_assert_eq(lt_map_get(m, "alpha"), &a);
  cr_assert_eq(lt_map_get(m, "beta"), &b);
  cr_assert_null(lt_map_get(m, "gamma"));
  cr_assert_not(lt_map_has(m, "gamma"));
  cr_assert_eq(lt_map_set(m, "alpha", &c), LT_OK);
  cr_assert_eq(lt_map_get(m, "alpha"), &c);
  cr_assert_eq(lt_map_count(m), 2);
  cr_assert(lt_map_del(m, "alpha"));
  cr_assert_not(lt_map_del(m, "alpha"));
  cr_assert_not(lt_map_has(m, "alpha"));
  cr_assert_eq(lt_map_get(m, "beta"), &b);
  cr_assert_eq(lt_map_count(m), 1);
  lt_map_destroy(m);
}

Test(map, a_set_stores_null_and_has_tells_presence) {
  lt_map_t *m = lt_map_new(NULL);
  cr_assert_eq(lt_map_set(m, "tenant-a/ds-1", NULL), LT_OK);
  cr_assert(lt_map_has(m, "tenant-a/ds-1"));
  cr_assert_null(lt_map_get(m, "tenant-a/ds-1"));
  cr_assert_not(lt_map_has(m, "tenant-a/ds-2"));
  lt_map_destroy(m);
}

Test(map, the_key_is_copied) {
  lt_map_t *m = lt_map_new(NULL);
  char key[16] = "job-1";
  int v = 7;
  lt_map_set(m, key, &v);
  strcpy(key, "job-2");
  cr_assert_eq(lt_map_get(m, "job-1"), &v);
  cr_assert_not(lt_map_has(m, "job-2"));
  lt_map_destroy(m);
}

Test(map, owned_values_are_freed_on_replace_delete_and_free) {
  freed = 0;
  lt_map_t *m = lt_map_new(count_free);
  lt_map_set(m, "a", boxed(1));
  lt_map_set(m, "a", boxed(2)); /* frees 1 */
  cr_assert_eq(freed, 1);
  cr_assert_eq(*(int *)lt_map_get(m, "a"), 2);
  lt_map_set(m, "b", boxed(3));
  lt_map_del(m, "b"); /* frees 3 */
  cr_assert_eq(freed, 2);
  lt_map_set(m, "c", NULL); /* NULL is never passed to the free function */
  lt_map_destroy(m);       /* frees 2 */
  cr_assert_eq(freed, 3);
}

Test(map, grows_and_keeps_every_key) {
  lt_map_t *m = lt_map_new(count_free);
  char key[32];
  for (int i = 0; i < 20000; i++) {
    snprintf(key, sizeof key, "key-%d", i);
    cr_assert_eq(lt_map_set(m, key, boxed(i)), LT_OK);
  }
  cr_assert_eq(lt_map_count(m), 20000);
  for (int i = 0; i < 20000; i += 2) {
    snprintf(key, sizeof key, "key-%d", i);
    cr_assert(lt_map_del(m, key));
  }
  cr_assert_eq(lt_map_count(m), 10000);
  for (int i = 0; i < 20000; i++) {
    snprintf(key, sizeof key, "key-%d", i);
    int *v = lt_map_get(m, key);
    if (i % 2) cr_assert(v && *v == i, "key-%d lost", i);
    else cr_assert_null(v, "key-%d came back", i);
  }
  lt_map_destroy(m);
}

Test(map, iterates_in_insertion_order) {
  lt_map_t *m = lt_map_new(NULL);
  const char *keys[] = {"zeta", "alpha", "mu", "beta", "omega"};
  int vals[5];
  for (int i = 0; i < 5; i++) lt_map_set(m, keys[i], &vals[i]);
  lt_map_set(m, "mu", &vals[2]); /* a replacement keeps its place */
  lt_map_del(m, "alpha");
  lt_map_set(m, "alpha", &vals[1]); /* re-inserted: now last */
  const char *want[] = {"zeta", "mu", "beta", "omega", "alpha"};
  lt_map_iter_t it = {0};
  int n = 0;
  while (lt_map_next(m, &it)) {
    cr_assert_lt(n, 5);
    cr_assert_str_eq(it.key, want[n]);
    cr_assert_eq(lt_map_get(m, it.key), it.value);
    n++;
  }
  cr_assert_eq(n, 5);
  lt_map_destroy(m);
}

Test(map, deleting_the_current_key_while_iterating) {
  lt_map_t *m = lt_map_new(NULL);
  char key[16];
  for (int i = 0; i < 100; i++) {
    snprintf(key, sizeof key, "k%d", i);
    lt_map_set(m, key, NULL);
  }
  lt_map_iter_t it = {0};
  int seen = 0;
  while (lt_map_next(m, &it)) {
    seen++;
    if (atoi(it.key + 1) % 3 == 0) lt_map_del(m, it.key);
  }
  cr_assert_eq(seen, 100);
  cr_assert_eq(lt_map_count(m), 66);
  lt_map_destroy(m);
}

Test(map, colliding_keys_stay_reachable_across_a_delete) {
  /* Five keys whose hashes agree in their low 16 bits share one probe chain in any index of up
   * to 65536 slots; deleting the second must not cut the chain to the ones after it. */
  char keys[5][16];
  int found = 0;
  uint64_t want = lt_map_hash("c0") & 0xffff;
  snprintf(keys[found++], sizeof keys[0], "c0");
  for (int i = 1; found < 5 && i < 50000000; i++) {
    char k[16];
    snprintf(k, sizeof k, "c%d", i);
    if ((lt_map_hash(k) & 0xffff) == want) snprintf(keys[found++], sizeof keys[0], "%s", k);
  }
  cr_assert_eq(found, 5);
  lt_map_t *m = lt_map_new(NULL);
  int v[5];
  for (int i = 0; i < 5; i++) lt_map_set(m, keys[i], &v[i]);
  cr_assert(lt_map_del(m, keys[1]));
  for (int i = 0; i < 5; i++) {
    if (i == 1) cr_assert_not(lt_map_has(m, keys[i]));
    else cr_assert_eq(lt_map_get(m, keys[i]), &v[i], "%s lost", keys[i]);
  }
  lt_map_set(m, keys[1], &v[1]);
  cr_assert_eq(lt_map_get(m, keys[1]), &v[1]);
  cr_assert_eq(lt_map_count(m), 5);
  lt_map_destroy(m);
}

Test(map, churn_reuses_room_left_by_deleted_keys) {
  /* Few live keys, many come and go: rebuilds drop the deleted entries; order and values hold. */
  lt_map_t *m = lt_map_new(NULL);
  int v[3];
  lt_map_set(m, "keep-0", &v[0]);
  lt_map_set(m, "keep-1", &v[1]);
  char key[32];
  for (int i = 0; i < 10000; i++) {
    snprintf(key, sizeof key, "tmp-%d", i);
    cr_assert_eq(lt_map_set(m, key, &v[2]), LT_OK);
    cr_assert(lt_map_del(m, key));
  }
  lt_map_set(m, "keep-2", &v[2]);
  cr_assert_eq(lt_map_count(m), 3);
  lt_map_iter_t it = {0};
  for (int i = 0; i < 3; i++) {
    cr_assert(lt_map_next(m, &it));
    snprintf(key, sizeof key, "keep-%d", i);
    cr_assert_str_eq(it.key, key);
    cr_assert_eq(it.value, &v[i]);
  }
  cr_assert_not(lt_map_next(m, &it));
  lt_map_destroy(m);
}
