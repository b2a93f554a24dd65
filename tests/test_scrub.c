/* Tests of the worker's scrub (workers/lt_scrub): an attempt's private tree, as a killed executor
 * leaves it (an upload spool in a subdirectory, nested state, a read-only file), is overwritten
 * and removed, and the bytes zeroed are counted; what a hostile executor could plant there (a
 * symbolic link to a file of the worker, a hard link to one, a deep nest) never makes the scrub
 * touch anything outside the tree. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "lt_scrub.h"

static char root[256]; /* a private directory per test, holding the tree and the outside files */

static void setup(void) {
  snprintf(root, sizeof root, "/tmp/lt_scrub_test_XXXXXX");
  cr_assert_not_null(mkdtemp(root));
}

static void teardown(void) {
  char cmd[320];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  cr_expect_eq(system(cmd), 0);
}

TestSuite(scrub, .init = setup, .fini = teardown);

static void put(const char *rel, const char *text, size_t copies, mode_t mode) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "%s", path);
  for (size_t i = 0; i < copies; i++) fputs(text, f);
  fclose(f);
  chmod(path, mode);
}

static void mkdirs(const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  cr_assert_eq(mkdir(path, 0700), 0, "%s", path);
}

static bool exists(const char *rel) {
  char path[512];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", root, rel);
  return lstat(path, &st) == 0;
}

static char *read_all(const char *rel) {
  static char buf[4096];
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

Test(scrub, a_killed_attempts_tree_with_an_upload_spool_is_zeroed_and_gone) {
  static const char canary[] = "CANARY-tenant-a-7f3e ";
  mkdirs("attempt");
  mkdirs("attempt/upload");
  mkdirs("attempt/upload/40");
  put("attempt/state.bin", canary, 100, 0600);                    /* 2,100 bytes */
  put("attempt/upload/adapter_model.safetensors", canary, 1000, 0600); /* 21,000 */
  put("attempt/upload/40/samples.json", canary, 10, 0400);        /* 210, read-only */
  put("attempt/upload/40/empty", "", 0, 0600);
  /* A mapping of one file outlives its name: after the scrub it must read zeros, the proof that
   * the bytes were overwritten before the file was removed (a bare unlink leaves them on disk). */
  char path[512];
  snprintf(path, sizeof path, "%s/attempt/upload/adapter_model.safetensors", root);
  int fd = open(path, O_RDONLY);
  cr_assert_geq(fd, 0);
  size_t len = 21000;
  const char *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
  cr_assert_neq(map, MAP_FAILED);
  close(fd);
  cr_assert_eq(memcmp(map, canary, strlen(canary)), 0);

  snprintf(path, sizeof path, "%s/attempt", root);
  int64_t zeroed = -1;
  char err[256] = "";
  cr_assert_eq(lt_scrub_tree(path, &zeroed, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(zeroed, 2100 + 21000 + 210, "zeroed %lld bytes", (long long)zeroed);
  cr_expect_not(exists("attempt"), "the attempt's directory is gone");
  for (size_t i = 0; i < len; i++)
    if (map[i]) cr_assert_fail("byte %zu of a scrubbed file still holds data (%d)", i, map[i]);
  munmap((void *)map, len);
}

Test(scrub, links_planted_by_an_executor_touch_nothing_outside_the_tree) {
  put("worker-secret", "worker's own bytes", 1, 0600);
  put("worker-hardlinked", "also the worker's", 1, 0600);
  mkdirs("attempt");
  mkdirs("attempt/sub");
  char target[512], where[512];
  snprintf(target, sizeof target, "%s/worker-secret", root);
  snprintf(where, sizeof where, "%s/attempt/sub/secret-link", root);
  cr_assert_eq(symlink(target, where), 0);
  snprintf(where, sizeof where, "%s/attempt/dir-link", root);
  cr_assert_eq(symlink(root, where), 0); /* a link to a directory is not entered */
  snprintf(target, sizeof target, "%s/worker-hardlinked", root);
  snprintf(where, sizeof where, "%s/attempt/hard", root);
  cr_assert_eq(link(target, where), 0);
  put("attempt/sub/own", "0123456789", 1, 0600);

  char path[512], err[256] = "";
  snprintf(path, sizeof path, "%s/attempt", root);
  int64_t zeroed = -1;
  cr_assert_eq(lt_scrub_tree(path, &zeroed, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(zeroed, 10, "only the tree's own file is overwritten, not %lld bytes", (long long)zeroed);
  cr_expect_not(exists("attempt"));
  cr_expect_str_eq(read_all("worker-secret"), "worker's own bytes");
  cr_expect_str_eq(read_all("worker-hardlinked"), "also the worker's");
  cr_expect(exists("worker-secret"));
}

Test(scrub, a_nest_deeper_than_the_limit_does_not_stop_the_scrub) {
  char rel[4096] = "attempt";
  mkdirs(rel);
  for (int i = 0; i < LT_SCRUB_MAX_DEPTH + 8; i++) {
    strcat(rel, "/d");
    mkdirs(rel);
  }
  put("attempt/top", "abc", 1, 0600);
  char path[512], err[256] = "";
  snprintf(path, sizeof path, "%s/attempt", root);
  int64_t zeroed = -1;
  lt_err_t e = lt_scrub_tree(path, &zeroed, err, sizeof err);
  /* The part below the limit cannot be removed without recursing: an error that says so, and
   * everything above it (the file beside the nest) is zeroed and gone all the same. */
  cr_expect_eq(e, LT_ERR_IO, "%s", err);
  cr_expect(strstr(err, "scrub:") != NULL, "%s", err);
  cr_expect_eq(zeroed, 3);
  cr_expect_not(exists("attempt/top"));
}

Test(scrub, a_missing_directory_is_nothing_to_do) {
  char path[512], err[256] = "";
  snprintf(path, sizeof path, "%s/never-made", root);
  int64_t zeroed = -1;
  cr_expect_eq(lt_scrub_tree(path, &zeroed, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(zeroed, 0);
}
