/* fuzz_safetensors: a base model's files as a worker reads them from the models directory (a
 * Hub download is untrusted bytes): safetensors files (lt_st_open_file: header length, JSON
 * header, dtypes, shapes, offsets, overlaps) and config.json (lt_model_config_parse).
 *
 * First byte: mode (low 2 bits); the rest:
 *   0  a whole safetensors file
 *   1  its JSON header up to the first NUL byte, then the data: the harness writes the 8-byte
 *      length in front, so that the fuzzer spends its time on the header
 *   2  a config.json
 * The file lives in a memfd (no disk). Properties: every tensor of an opened file lies inside
 * the data section, has numel x element size bytes, is found by its name, and F32/F16/BF16 ones
 * read as floats with their own shape. */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "lt_engine.h"
#include "lt_safetensors.h"

static void check_file(const uint8_t *file, size_t size) {
  int fd = memfd_create("fuzz_safetensors", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  FUZZ_CHECK(write(fd, file, size) == (ssize_t)size, "short write to the memfd");
  char path[64], err[512];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  lt_st_t *st = NULL;
  if (lt_st_open_file(path, &st, err, sizeof err) == LT_OK) {
    for (size_t i = 0; i < lt_st_count(st); i++) {
      const lt_st_tensor_t *t = lt_st_at(st, i);
      FUZZ_CHECK(lt_st_find(st, t->name) == t, "tensor %s is not found by its name", t->name);
      FUZZ_CHECK(t->ndim >= 0 && t->ndim <= LT_ST_MAX_DIMS, "%s has %d dims", t->name, t->ndim);
      FUZZ_CHECK(t->nbytes == (size_t)t->numel * lt_st_dtype_size(t->dtype), "%s: %zu bytes for %lld elements",
                 t->name, t->nbytes, (long long)t->numel);
      /* Every byte is readable: outside the mapping this faults. */
      volatile uint8_t x = 0;
      for (size_t k = 0; k < t->nbytes && k < (1u << 20); k++) x ^= ((const uint8_t *)t->data)[k];
      (void)x;
      if ((t->dtype == LT_ST_F32 || t->dtype == LT_ST_F16 || t->dtype == LT_ST_BF16) && t->numel <= (1 << 16)) {
        const float *f = NULL;
        float *owned = NULL;
        lt_err_t e = lt_st_get_f32(st, t->name, t->ndim, t->shape, &f, &owned, err, sizeof err);
        FUZZ_CHECK(e == LT_OK, "%s does not read with its own shape: %s", t->name, err);
        volatile float sum = 0;
        for (int64_t k = 0; k < t->numel; k++) sum += f[k];
        (void)sum;
        free(owned);
      }
    }
    lt_st_close(st);
  }
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t mode = fuzz_take(&data, &size) & 3;
  if (mode == 0 || mode == 3) {
    check_file(data, size);
  } else if (mode == 1) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t hlen = nul ? (size_t)(nul - data) : size, dlen = nul ? size - hlen - 1 : 0;
    uint8_t *file = malloc(8 + hlen + dlen);
    for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(file + 8, data, hlen);
    if (dlen) memcpy(file + 8 + hlen, nul + 1, dlen);
    check_file(file, 8 + hlen + dlen);
    free(file);
  } else {
    lt_model_config_t cfg;
    char err[512];
    if (lt_model_config_parse((const char *)data, size, "config.json", &cfg, err, sizeof err) == LT_OK)
      FUZZ_CHECK(cfg.num_layers > 0 && cfg.hidden_size > 0 && cfg.num_heads > 0 && cfg.num_kv_heads > 0 &&
                     cfg.num_heads % cfg.num_kv_heads == 0 && cfg.head_dim > 0 && cfg.vocab_size > 0,
                 "an accepted config.json has impossible sizes: layers %d hidden %d heads %d/%d head_dim %d vocab %d",
                 cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size);
  }
  return 0;
}
