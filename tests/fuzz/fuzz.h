/* fuzz.h: what the harnesses of tests/fuzz share. A harness is one LLVMFuzzerTestOneInput over a
 * real parser of Lathe's: it frees everything it made (leaks are findings), touches no network
 * and no shared state beyond a lazily built, process-wide fixture (a registry, a key, a model),
 * and checks a property of what the parser accepted with FUZZ_CHECK, which aborts: libFuzzer and
 * fuzz_replay both report an abort as a crash, with the input that caused it. */
#ifndef LT_FUZZ_H
#define LT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond);        \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fputc('\n', stderr);                                                               \
      abort();                                                                           \
    }                                                                                    \
  } while (0)

/* Takes the first byte of *data as a selector (0 when there is none). */
static inline uint8_t fuzz_take(const uint8_t **data, size_t *size) {
  if (*size == 0) return 0;
  uint8_t b = **data;
  (*data)++;
  (*size)--;
  return b;
}

#endif
