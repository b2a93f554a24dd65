/* fuzz_state: a training state file (LTSTATE, lt_load_state) as a worker fetches it from the
 * store to resume a job or a session (state.bin of a checkpoint): magic, version, the header
 * that pins model and adapter shape, parameters and moments, the checksum, trailing bytes.
 *
 * Fixture: a random 2-layer model (lt_model_init_random) on the CPU backend and one LoRA
 * session, in a directory under /dev/shm removed at exit. Input: the file.
 * Property: a state that loads saves back (lt_save_state, with the cursor it gave) to the same
 * bytes. */
#include <dirent.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "lt_engine.h"

typedef struct {
  char dir[64], in[96], out[96];
  lt_backend_t *be;
  lt_engine_t *eng;
  lt_session_t *sess;
} fixture_t;

static fixture_t fx;

static void rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (e->d_type == DT_DIR) rm_dir(p);
    else unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static void fixture_free(void) {
  lt_session_destroy(fx.sess);
  lt_engine_close(fx.eng);
  lt_backend_destroy(fx.be);
  rm_dir(fx.dir);
}

static lt_session_t *session(void) {
  if (fx.sess) return fx.sess;
  char err[512], model[96];
  snprintf(fx.dir, sizeof fx.dir, "/dev/shm/lt-fuzz-state-XXXXXX");
  FUZZ_CHECK(mkdtemp(fx.dir), "mkdtemp failed");
  snprintf(model, sizeof model, "%s/model", fx.dir);
  snprintf(fx.in, sizeof fx.in, "%s/in.bin", fx.dir);
  snprintf(fx.out, sizeof fx.out, "%s/out.bin", fx.dir);
  lt_model_config_t c = {.vocab_size = 67, .hidden_size = 32, .intermediate_size = 44, .num_layers = 2,
                         .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .max_position = 64,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f};
  lt_session_config_t sc = {.rank = 2, .alpha = 4.0f, .targets = LT_TARGET_Q | LT_TARGET_V, .seed = 7};
  if (lt_model_init_random(&c, model, 1, 0.1f, 0.0f, err, sizeof err) ||
      lt_backend_cpu_new(1, &fx.be, err, sizeof err) || lt_engine_open(model, fx.be, &fx.eng, err, sizeof err) ||
      lt_session_new(fx.eng, &sc, &fx.sess, err, sizeof err)) {
    fprintf(stderr, "fuzz_state: fixture: %s\n", err);
    abort();
  }
  atexit(fixture_free);
  return fx.sess;
}

/* The whole file at path into a new buffer. */
static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  FUZZ_CHECK(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  FUZZ_CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n, "short read of %s", path);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lt_session_t *s = session();
  FILE *f = fopen(fx.in, "wb");
  FUZZ_CHECK(f && fwrite(data, 1, size, f) == size && fclose(f) == 0, "cannot write %s", fx.in);
  char err[512];
  uint64_t cursor = 0;
  if (lt_load_state(s, fx.in, &cursor, err, sizeof err) == LT_OK) {
    FUZZ_CHECK(lt_save_state(s, fx.out, cursor, err, sizeof err) == LT_OK, "a loaded state does not save: %s", err);
    size_t len = 0;
    uint8_t *back = slurp(fx.out, &len);
    if (data[8] == 2) { /* the current version: the same bytes back */
      FUZZ_CHECK(len == size && memcmp(back, data, size) == 0, "load then save changed the file (%zu -> %zu bytes)",
                 size, len);
    } else { /* an older one is saved as the current: that file loads and saves to itself */
      FUZZ_CHECK(len >= 16 && back[8] == 2, "an older state saved as version %d", len >= 16 ? back[8] : -1);
      uint64_t c2 = 0;
      FUZZ_CHECK(lt_load_state(s, fx.out, &c2, err, sizeof err) == LT_OK && c2 == cursor,
                 "the re-saved state does not load back: %s", err);
      FUZZ_CHECK(lt_save_state(s, fx.in, c2, err, sizeof err) == LT_OK, "%s", err);
      size_t len2 = 0;
      uint8_t *again = slurp(fx.in, &len2);
      FUZZ_CHECK(len2 == len && memcmp(again, back, len) == 0, "a re-saved state saved again differs");
      free(again);
    }
    free(back);
  } else {
    FUZZ_CHECK(err[0], "refused without a message");
  }
  return 0;
}
