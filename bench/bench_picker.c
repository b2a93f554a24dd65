/* bench_picker: the sampler's token picker (lt_picker_pick, workers/engine/lt_serve.c) at a
 * real vocabulary, with top_p and top_k against the untruncated draw at the same temperature in
 * the same run. The picker runs under the sampler's lock once per running request and token, so
 * its cost adds to every step of the batch.
 *
 * Logits: V = 49,152 (SmolLM2's vocabulary), drawn N(0, 2.5) with 20 tokens lifted by 8 to 14
 * (a peaked next-token distribution, as a trained model's), fixed seed. Each setting picks
 * LATHE_BENCH_PICKS (2000) tokens with its own picker (seed 7), over LATHE_BENCH_ROUNDS (5)
 * rounds, the settings interleaved in each; the figure is the median round's microseconds a pick.
 *
 * Last line: `picker_top_p_vs_plain: R` (top_p 0.95's time a pick / the untruncated draw's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "lt_serve.h"

enum { NV = 49152 };

static double gauss(unsigned *s) {
  double a = (rand_r(s) + 1.0) / (RAND_MAX + 2.0), b = (rand_r(s) + 1.0) / (RAND_MAX + 2.0);
  return sqrt(-2 * log(a)) * cos(2 * M_PI * b);
}

int main(void) {
  const char *e = getenv("LATHE_BENCH_PICKS");
  int picks = e ? atoi(e) : 2000, rounds = (e = getenv("LATHE_BENCH_ROUNDS")) ? atoi(e) : 5;
  if (picks < 1 || rounds < 1 || rounds > 64) return fprintf(stderr, "bench_picker: bad settings\n"), 2;
  float *lg = malloc(NV * sizeof *lg);
  unsigned s = 3;
  for (int j = 0; j < NV; j++) lg[j] = (float)(2.5 * gauss(&s));
  for (int i = 0; i < 20; i++) lg[rand_r(&s) % NV] += 8 + (float)(rand_r(&s) % 7);
  const struct {
    const char *name;
    lt_sample_params_t sp;
  } set[] = {{"plain (temperature 1)", {.max_tokens = 1, .temperature = 1, .top_p = 1}},
             {"top_p 0.95", {.max_tokens = 1, .temperature = 1, .top_p = 0.95f}},
             {"top_k 50, top_p 0.9", {.max_tokens = 1, .temperature = 1, .top_p = 0.9f, .top_k = 50}},
             {"greedy", {.max_tokens = 1, .temperature = 0, .top_p = 1}}};
  enum { NS = sizeof set / sizeof *set };
  double us[NS][64];
  long long sink = 0;
  char err[256];
  for (int r = 0; r < rounds; r++)
    for (int k = 0; k < NS; k++) {
      lt_picker_t p;
      if (lt_picker_init(&p, NV, 7, err, sizeof err)) return fprintf(stderr, "bench_picker: %s\n", err), 1;
      double t0 = bench_now_s();
      for (int i = 0; i < picks; i++) sink += lt_picker_pick(&p, lg, &set[k].sp, NULL, 0, NULL, NULL);
      us[k][r] = (bench_now_s() - t0) * 1e6 / picks;
      lt_picker_free(&p);
    }
  double med[NS];
  for (int k = 0; k < NS; k++) {
    med[k] = bench_median(us[k], rounds);
    printf("%-24s %8.1f us a pick (%.2fx the plain draw)\n", set[k].name, med[k], med[k] / med[0]);
  }
  printf("(%d picks x %d rounds, V %d; checksum %lld)\n", picks, rounds, NV, sink);
  printf("picker_top_p_vs_plain: %.2f\n", med[1] / med[0]);
  free(lg);
  return 0;
}
