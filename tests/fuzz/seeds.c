/* fuzz_seeds: writes the binary part of the seed corpora (tests/fuzz/corpus/<name>/gen-*): what
 * Lathe's own writers make, so that the fuzzers start from inputs that parse. The text seeds
 * (JSON bodies, JSONL, paths) are written by hand beside them.
 *
 *   fuzz_seeds OUTDIR    writes OUTDIR/{avro,jobspec,tokenizer,crypto,state,safetensors}/gen-*
 *
 * The crypto and state seeds must open under the harnesses' own fixtures (test keys, the random
 * model and session), so this file includes those harnesses for them. */
#define LLVMFuzzerTestOneInput lt_fuzz_seed_crypto
#include "fuzz_crypto.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput lt_fuzz_seed_state
#include "fuzz_state.c"
#undef LLVMFuzzerTestOneInput

#include <sys/stat.h>

#include "lt_avro.h"
#include "lt_job_record.h"
#include "lt_jobspec.h"
#include "lt_safetensors.h"
#include "lt_task.h"
#include "lt_tok.h"

static const char *outdir;

/* Writes OUTDIR/name/gen-<file>: the mode byte (when mode >= 0), then len bytes of p. */
static void put(const char *name, const char *file, int mode, const void *p, size_t len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", outdir, name);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/%s/gen-%s", outdir, name, file);
  FILE *f = fopen(path, "wb");
  FUZZ_CHECK(f, "cannot write %s", path);
  if (mode >= 0) fputc(mode, f);
  fwrite(p, 1, len, f);
  fclose(f);
}

/* Every schema version at its defaults: as a single-object record (mode 0), as a bare body of
 * that writer (mode 1, schema index), and the newest version's JSON form (mode 2). */
static void seed_avro(void) {
  lt_avro_registry_t *reg = NULL;
  char err[512], file[128];
  FUZZ_CHECK(lt_avro_registry_new(&reg, err, sizeof err) == LT_OK, "%s", err);
  for (size_t i = 0; i < lt_avro_registry_count(reg); i++) {
    const lt_avro_schema_t *s = lt_avro_registry_at(reg, i);
    lt_avro_record_t *rec = NULL;
    FUZZ_CHECK(lt_avro_record_new_schema(reg, s, &rec, err, sizeof err) == LT_OK, "%s", err);
    const uint8_t *enc;
    size_t len;
    snprintf(file, sizeof file, "%s-v%d", lt_avro_schema_name(s), lt_avro_schema_version(s));
    FUZZ_CHECK(lt_avro_record_encode(rec, &enc, &len, err, sizeof err) == LT_OK, "%s", err);
    put("avro", file, 0, enc, len);
    if (len > LT_AVRO_HEADER_SIZE) {
      uint8_t *body = malloc(len - LT_AVRO_HEADER_SIZE + 1);
      body[0] = (uint8_t)i;
      memcpy(body + 1, enc + LT_AVRO_HEADER_SIZE, len - LT_AVRO_HEADER_SIZE);
      snprintf(file, sizeof file, "%s-v%d-body", lt_avro_schema_name(s), lt_avro_schema_version(s));
      put("avro", file, 1, body, len - LT_AVRO_HEADER_SIZE + 1);
      free(body);
    }
    if (lt_avro_schema_is_latest(s)) {
      char *json = NULL;
      FUZZ_CHECK(lt_avro_record_to_json(rec, &json, err, sizeof err) == LT_OK, "%s", err);
      size_t jl = strlen(json);
      char *b = malloc(jl + 1);
      b[0] = (char)i;
      memcpy(b + 1, json, jl);
      snprintf(file, sizeof file, "%s-json", lt_avro_schema_name(s));
      put("avro", file, 2, b, jl + 1);
      free(b);
      free(json);
      size_t cl;
      const char *schema = lt_avro_schema_json(s, &cl);
      snprintf(file, sizeof file, "%s-schema", lt_avro_schema_name(s));
      put("avro", file, 3, schema, cl);
    }
    lt_avro_record_destroy(rec);
  }
  /* jobspec: a valid submission as a JobSubmitted record */
  lt_jobspec_t spec;
  lt_jobspec_defaults(&spec);
  snprintf(spec.base_model, sizeof spec.base_model, "lathe-tiny");
  snprintf(spec.dataset_id, sizeof spec.dataset_id, "ds-0123456789abcdef");
  snprintf(spec.suffix, sizeof spec.suffix, "my-run");
  spec.nmeta = 1;
  snprintf(spec.meta[0].key, sizeof spec.meta[0].key, "team");
  snprintf(spec.meta[0].value, sizeof spec.meta[0].value, "search");
  lt_avro_record_t *rec = NULL;
  FUZZ_CHECK(lt_avro_record_new(reg, "JobSubmitted", &rec, err, sizeof err) == LT_OK, "%s", err);
  FUZZ_CHECK(lt_jobspec_to_record(&spec, rec, err, sizeof err) == LT_OK, "%s", err);
  lt_avro_set_string(rec, "job_id", "job-0123456789abcdef");
  lt_avro_set_string(rec, "tenant_id", "acme");
  const uint8_t *enc;
  size_t len;
  FUZZ_CHECK(lt_avro_record_encode(rec, &enc, &len, err, sizeof err) == LT_OK, "%s", err);
  put("jobspec", "JobSubmitted", 1, enc, len);
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
}

static void seed_tokenizer(void) {
  char *corpus = NULL, *json = NULL, err[256];
  size_t len = 0;
  FUZZ_CHECK(lt_task_corpus(3, 4000, &corpus, &len, err, sizeof err) == LT_OK, "%s", err);
  FUZZ_CHECK(lt_tok_train(corpus, len, 300, lt_task_specials, LT_TASK_N_SPECIAL, &json, err, sizeof err) == LT_OK,
             "%s", err);
  size_t jl = strlen(json);
  static const char text[] = "date: March 5, 2021\niso: 2021-03-05<|endoftext|> caf\xc3\xa9 \xf0\x9f\x99\x82";
  char *b = malloc(jl + sizeof text);
  memcpy(b, json, jl);
  b[jl] = '\0';
  memcpy(b + jl + 1, text, sizeof text - 1);
  put("tokenizer", "trained-300", -1, b, jl + sizeof text);
  free(b);
  free(json);
  free(corpus);
}

static void seed_crypto(void) {
  const keys_t *k = keys();
  char err[256];
  static const char plain[] = "{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n";
  for (size_t chunk = 16; chunk <= 4096; chunk *= 16) {
    size_t cap = lt_crypto_sealed_size(k->dek, sizeof plain - 1, chunk), n = 0;
    uint8_t *out = malloc(cap + 1);
    out[0] = 13; /* pieces of 92 bytes when streamed */
    FUZZ_CHECK(lt_crypto_seal(k->dek, OBJECT_KEY, chunk, plain, sizeof plain - 1, out + 1, cap, &n, err,
                              sizeof err) == LT_OK, "%s", err);
    char file[64];
    snprintf(file, sizeof file, "sealed-chunk%zu", chunk);
    put("crypto", file, 0, out, n + 1);
    free(out);
  }
  uint8_t in[4 + sizeof plain] = {40, 0x01, 0x20, 0x5a};
  memcpy(in + 4, plain, sizeof plain - 1);
  put("crypto", "seal-flip", 1, in, 3 + sizeof plain);
  uint8_t blob[LT_CRYPTO_WRAPPED_MAX];
  size_t blen = 0;
  FUZZ_CHECK(lt_crypto_dek_wrap(k->kek, k->dek, blob, sizeof blob, &blen, err, sizeof err) == LT_OK, "%s", err);
  put("crypto", "wrapped-dek", 2, blob, blen);
}

static void seed_state(void) {
  lt_session_t *s = session();
  char err[256];
  FUZZ_CHECK(lt_save_state(s, fx.out, 12345, err, sizeof err) == LT_OK, "%s", err);
  size_t len = 0;
  uint8_t *b = slurp(fx.out, &len);
  put("state", "lora-r2", -1, b, len);
  free(b);
}

static void seed_safetensors(void) {
  char dir[] = "/dev/shm/lt-fuzz-seeds-XXXXXX", path[128], err[256];
  FUZZ_CHECK(mkdtemp(dir), "mkdtemp");
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  float a[6] = {1, -2, 3.5f, 0, 1e-3f, 65504}, b[4] = {0.5f, -0.25f, 2, 1024};
  lt_st_entry_t e[] = {{.name = "model.embed_tokens.weight", .dtype = LT_ST_F32, .ndim = 2, .shape = {2, 3}, .data = a},
                       {.name = "model.norm.weight", .dtype = LT_ST_F16, .ndim = 1, .shape = {4}, .data = b},
                       {.name = "lm_head.weight", .dtype = LT_ST_BF16, .ndim = 2, .shape = {2, 2}, .data = b}};
  FUZZ_CHECK(lt_st_write(path, e, 3, err, sizeof err) == LT_OK, "%s", err);
  size_t len = 0;
  uint8_t *f = slurp(path, &len);
  put("safetensors", "three-dtypes", 0, f, len);
  /* mode 1: the header, a NUL, the data */
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f[i];
  uint8_t *m = malloc(len);
  memcpy(m, f + 8, hlen);
  m[hlen] = 0;
  memcpy(m + hlen + 1, f + 8 + hlen, len - 8 - hlen);
  put("safetensors", "three-dtypes-header", 1, m, len - 7);
  free(m);
  free(f);
  unlink(path);
  lt_model_config_t c = {.vocab_size = 67, .hidden_size = 32, .intermediate_size = 44, .num_layers = 2,
                         .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .max_position = 64,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 2.0f, .qkv_bias = 1};
  FUZZ_CHECK(lt_model_config_write(&c, dir, err, sizeof err) == LT_OK, "%s", err);
  snprintf(path, sizeof path, "%s/config.json", dir);
  f = slurp(path, &len);
  put("safetensors", "config-qwen2", 2, f, len);
  free(f);
  unlink(path);
  rmdir(dir);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds OUTDIR\n");
    return 2;
  }
  outdir = argv[1];
  mkdir(outdir, 0755);
  seed_avro();
  seed_tokenizer();
  seed_crypto();
  seed_state();
  seed_safetensors();
  return 0;
}
