/* lt_safetensors: reading and writing Hugging Face safetensors files.
 *
 * Format: 8-byte little-endian header length n, n bytes of JSON (an object mapping tensor names
 * to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional "__metadata__" object of
 * strings), then the raw little-endian tensor bytes; offsets are relative to the end of the
 * header. Files are mapped read-only and shared (MAP_SHARED, PROT_READ) so every executor of a
 * worker reads base weights from one copy in the page cache. F32 tensors are used in place;
 * F16 and BF16 are converted to f32 on request.
 *
 * Every malformed input (truncated file, header length beyond the file, bad JSON, unknown
 * dtype, offsets out of range or overlapping, size not matching the shape) is an error naming
 * the file, the tensor and what was expected. Opening never crashes on a hostile file.
 *
 * Threads: an lt_st_t is immutable after open; any thread may read it concurrently. */
#ifndef LT_SAFETENSORS_H
#define LT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

#define LT_ST_MAX_DIMS 8

typedef enum lt_st_dtype {
  LT_ST_F32 = 0,
  LT_ST_F16,
  LT_ST_BF16,
  LT_ST_F64,
  LT_ST_I64,
  LT_ST_I32,
  LT_ST_I16,
  LT_ST_I8,
  LT_ST_U8,
  LT_ST_BOOL,
} lt_st_dtype_t;

/* One tensor of an opened set. All fields are owned by the lt_st_t. */
typedef struct lt_st_tensor {
  const char *name;
  const char *file; /* path of the file holding it (for error messages) */
  lt_st_dtype_t dtype;
  int ndim;
  int64_t shape[LT_ST_MAX_DIMS];
  int64_t numel;
  const void *data; /* inside the read-only mapping; may be unaligned */
  size_t nbytes;
} lt_st_tensor_t;

typedef struct lt_st lt_st_t;

/* Opens one safetensors file. */
lt_err_t lt_st_open_file(const char *path, lt_st_t **out, char *errstr, size_t errstr_size);

/* Opens a model directory: `model.safetensors`, or the shards listed by
 * `model.safetensors.index.json` ({"weight_map": {tensor: shard file}}). A tensor present in two
 * shards, or listed in the index but absent from its shard, is an error. */
lt_err_t lt_st_open_dir(const char *dir, lt_st_t **out, char *errstr, size_t errstr_size);

/* Unmaps and frees. NULL-safe. Pointers obtained from the set become invalid. */
void lt_st_close(lt_st_t *st);

/* Number of tensors and the i-th (in no particular order). */
size_t lt_st_count(const lt_st_t *st);
const lt_st_tensor_t *lt_st_at(const lt_st_t *st, size_t i);

/* The tensor called `name`, or NULL. */
const lt_st_tensor_t *lt_st_find(const lt_st_t *st, const char *name);

/* Float32 view of tensor `name`, which must exist and have exactly the shape
 * shape[0..ndim-1] (dtype F32, F16 or BF16). On success *data points at numel floats: the mapping
 * itself when the tensor is aligned F32 (*owned = NULL), else a malloc'd converted copy which
 * the caller frees (*owned = the same pointer). Errors name the file, tensor, and the expected
 * vs found dtype/shape; a missing tensor is LT_ERR_NOT_FOUND. */
lt_err_t lt_st_get_f32(const lt_st_t *st, const char *name, int ndim, const int64_t *shape,
                       const float **data, float **owned, char *errstr, size_t errstr_size);

/* dtype name as in the file ("F32"), and its element size in bytes. */
const char *lt_st_dtype_name(lt_st_dtype_t dt);
size_t lt_st_dtype_size(lt_st_dtype_t dt);

/* ---- writing ---------------------------------------------------------------------------- */

/* One tensor to write: f32 source data converted to `dtype` (F32, F16 or BF16, round to nearest
 * even). */
typedef struct lt_st_entry {
  const char *name;
  lt_st_dtype_t dtype;
  int ndim;
  int64_t shape[LT_ST_MAX_DIMS];
  const float *data;
} lt_st_entry_t;

/* Writes a safetensors file atomically (temporary file + rename): tensors in the given order,
 * header padded with spaces to a multiple of 8, `__metadata__` = {"format": "pt"}. Names must be
 * unique. */
lt_err_t lt_st_write(const char *path, const lt_st_entry_t *entries, size_t n, char *errstr,
                     size_t errstr_size);

/* Half-precision conversions used by the loader and writer (exposed for tests). */
float lt_st_f16_to_f32(uint16_t h);
float lt_st_bf16_to_f32(uint16_t h);
uint16_t lt_st_f32_to_f16(float f);

/* Float to bf16, nearest even (NaN stays a quiet NaN). Inline: the cpu backend rounds every
 * weight of a bf16 copy and every activation row of a bf16 product through it, and the call per
 * element was 3.4 % of a batch-8 decode profile. */
static inline uint16_t lt_st_f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1);                                          /* nearest even */
  return (uint16_t)(u >> 16);
}

#endif
