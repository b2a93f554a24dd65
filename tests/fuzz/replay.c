/* fuzz_replay: runs every fuzz harness of tests/fuzz over every file of its seed corpus, built
 * with the ordinary compiler and no libFuzzer, so that CI replays the corpora in seconds and an
 * input that once crashed a parser (kept in its corpus) keeps being tried.
 *
 *   fuzz_replay CORPUS_ROOT [NAME...]   each harness (or those named) over CORPUS_ROOT/NAME/
 *   fuzz_replay --file NAME PATH...     one harness over the given files (reproducing a crash)
 *
 * A harness asserts its own properties and aborts on a violation; this program fails when a
 * corpus directory is missing or holds no input, and prints how many inputs each harness ran. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int harness_fn(const uint8_t *data, size_t size);

/* Each fuzz_<name>.c, compiled with LLVMFuzzerTestOneInput renamed (tests/fuzz/meson.build). */
harness_fn lt_fuzz_avro_one, lt_fuzz_dataset_one, lt_fuzz_jobspec_one, lt_fuzz_http_one,
    lt_fuzz_safetensors_one, lt_fuzz_tokenizer_one, lt_fuzz_crypto_one, lt_fuzz_state_one;

static const struct {
  const char *name;
  harness_fn *fn;
} harnesses[] = {
    {"avro", lt_fuzz_avro_one},       {"dataset", lt_fuzz_dataset_one},
    {"jobspec", lt_fuzz_jobspec_one}, {"http", lt_fuzz_http_one},
    {"safetensors", lt_fuzz_safetensors_one}, {"tokenizer", lt_fuzz_tokenizer_one},
    {"crypto", lt_fuzz_crypto_one},   {"state", lt_fuzz_state_one},
};
#define NHARNESS (sizeof harnesses / sizeof *harnesses)

/* Runs fn over the file at path, from a buffer of exactly its size (so an overread is one a
 * sanitizer sees). Returns the file's size, or -1 when it cannot be read. */
static long run_file(harness_fn *fn, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += r;
    if (n == cap) {
      uint8_t *nb = realloc(buf, cap *= 2);
      if (!nb) free(buf);
      buf = nb;
    }
  }
  int bad = ferror(f) || !buf;
  fclose(f);
  uint8_t *exact = bad ? NULL : malloc(n ? n : 1);
  if (exact) memcpy(exact, buf, n);
  free(buf);
  if (!exact) return -1;
  fn(exact, n);
  free(exact);
  return (long)n;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of root/name, in name order. Returns the number run, or -1 on failure. */
static long run_dir(const char *root, const char *name, harness_fn *fn, long *bytes) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", root, name);
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "fuzz_replay: %s: no corpus directory %s\n", name, dir);
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      char **nn = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
      if (!nn) break;
      names = nn;
    }
    names[n++] = strdup(e->d_name);
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, by_name);
  long ran = 0;
  *bytes = 0;
  for (size_t i = 0; i < n; i++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    long sz = run_file(fn, path);
    if (sz < 0) {
      fprintf(stderr, "fuzz_replay: %s: cannot read %s\n", name, path);
      ran = -1;
    } else if (ran >= 0) {
      ran++;
      *bytes += sz;
    }
    free(names[i]);
  }
  free(names);
  if (ran == 0) fprintf(stderr, "fuzz_replay: %s: corpus directory %s holds no input\n", name, dir);
  return ran > 0 ? ran : -1;
}

static harness_fn *find(const char *name) {
  for (size_t i = 0; i < NHARNESS; i++)
    if (strcmp(harnesses[i].name, name) == 0) return harnesses[i].fn;
  fprintf(stderr, "fuzz_replay: no harness %s (", name);
  for (size_t i = 0; i < NHARNESS; i++) fprintf(stderr, "%s%s", i ? ", " : "", harnesses[i].name);
  fprintf(stderr, ")\n");
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || (strcmp(argv[1], "--file") == 0 && argc < 4)) {
    fprintf(argc < 2 ? stderr : stdout,
            "usage: fuzz_replay CORPUS_ROOT [NAME...]\n       fuzz_replay --file NAME PATH...\n");
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "--file") == 0) {
    harness_fn *fn = find(argv[2]);
    if (!fn) return 2;
    for (int i = 3; i < argc; i++) {
      if (run_file(fn, argv[i]) < 0) {
        fprintf(stderr, "fuzz_replay: cannot read %s\n", argv[i]);
        return 1;
      }
      printf("fuzz_replay: %s: %s ok\n", argv[2], argv[i]);
    }
    return 0;
  }
  int failed = 0, nrun = 0;
  long inputs = 0;
  for (size_t i = 0; i < NHARNESS; i++) {
    int wanted = argc == 2;
    for (int a = 2; a < argc && !wanted; a++) wanted = strcmp(argv[a], harnesses[i].name) == 0;
    if (!wanted) continue;
    long bytes = 0, ran = run_dir(argv[1], harnesses[i].name, harnesses[i].fn, &bytes);
    if (ran < 0) {
      failed++;
      continue;
    }
    nrun++;
    inputs += ran;
    printf("fuzz_replay: %-12s %5ld inputs %9ld bytes  ok\n", harnesses[i].name, ran, bytes);
  }
  for (int a = 2; a < argc; a++)
    if (!find(argv[a])) failed++;
  printf("fuzz_replay: %d harnesses, %ld inputs, %d failed\n", nrun, inputs, failed);
  return failed ? 1 : 0;
}
