/* lt_safetensors: safetensors reader (mmap, validated header) and writer. See the header. */
#include "lt_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is refused: real ones are a few hundred KiB. */
#define LT_ST_MAX_HEADER (100u << 20)

typedef struct lt_st_file {
  char *path;
  void *map;
  size_t size;
} lt_st_file_t;

struct lt_st {
  lt_st_file_t *files;
  size_t nfiles;
  lt_st_tensor_t *tensors;
  size_t ntensors, cap;
  char **names; /* owned copies of tensor names, parallel to tensors */
};

static const struct {
  const char *name;
  lt_st_dtype_t dt;
  size_t size;
} dtypes[] = {
    {"F32", LT_ST_F32, 4}, {"F16", LT_ST_F16, 2}, {"BF16", LT_ST_BF16, 2}, {"F64", LT_ST_F64, 8},
    {"I64", LT_ST_I64, 8}, {"I32", LT_ST_I32, 4}, {"I16", LT_ST_I16, 2},   {"I8", LT_ST_I8, 1},
    {"U8", LT_ST_U8, 1},   {"BOOL", LT_ST_BOOL, 1},
};

const char *lt_st_dtype_name(lt_st_dtype_t dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].dt == dt) return dtypes[i].name;
  return "?";
}

size_t lt_st_dtype_size(lt_st_dtype_t dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].dt == dt) return dtypes[i].size;
  return 0;
}

/* ---- half precision --------------------------------------------------------------------- */

float lt_st_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float lt_st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp - 15 + 127) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t lt_st_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t exp = (int32_t)((u >> 23) & 0xff);
  uint32_t man = u & 0x7fffff;
  if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  exp = exp - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into exp: correct */
  return (uint16_t)half;
}

/* ---- reading ---------------------------------------------------------------------------- */

void lt_st_close(lt_st_t *st) {
  if (!st) return;
  for (size_t i = 0; i < st->nfiles; i++) {
    if (st->files[i].map && st->files[i].size) munmap(st->files[i].map, st->files[i].size);
    free(st->files[i].path);
  }
  for (size_t i = 0; i < st->ntensors; i++) free(st->names[i]);
  free(st->files);
  free(st->tensors);
  free(st->names);
  free(st);
}

size_t lt_st_count(const lt_st_t *st) { return st->ntensors; }
const lt_st_tensor_t *lt_st_at(const lt_st_t *st, size_t i) {
  return i < st->ntensors ? &st->tensors[i] : NULL;
}

const lt_st_tensor_t *lt_st_find(const lt_st_t *st, const char *name) {
  for (size_t i = 0; i < st->ntensors; i++)
    if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
  return NULL;
}

typedef struct span {
  uint64_t begin, end;
  size_t idx;
} span_t;

static int span_cmp(const void *a, const void *b) {
  const span_t *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* Adds a file record to st and maps the file; *out gets the record. */
static lt_err_t st_map_file(lt_st_t *st, const char *path, lt_st_file_t **out, char *errstr,
                            size_t errstr_size) {
  lt_st_file_t *nf = realloc(st->files, (st->nfiles + 1) * sizeof *nf);
  if (!nf) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: out of memory", path);
  st->files = nf;
  lt_st_file_t *f = &st->files[st->nfiles];
  memset(f, 0, sizeof *f);
  f->path = strdup(path);
  if (!f->path) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: out of memory", path);
  st->nfiles++;

  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return lt_errf(errstr, errstr_size, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO,
                   "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: not a regular file", path);
  }
  if (sb.st_size < 8) {
    close(fd);
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: truncated: %lld bytes, a safetensors file starts with an 8-byte header "
                   "length",
                   path, (long long)sb.st_size);
  }
  f->size = (size_t)sb.st_size;
  f->map = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
  }
  *out = f;
  return LT_OK;
}

/* One header entry: dtype, shape and data_offsets checked against each other and against the
 * data section's size. t gets dtype, ndim and shape; [*b, *e) the byte range; *numel the
 * element count. */
static lt_err_t st_parse_entry(const char *path, const char *key, json_t *val,
                               uint64_t data_size, lt_st_tensor_t *t, uint64_t *numel_out,
                               json_int_t *b_out, json_int_t *e_out, char *errstr,
                               size_t errstr_size) {
  if (!json_is_object(val))
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: tensor \"%s\": expected an object with dtype, shape, data_offsets", path,
                   key);
  json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
         *jo = json_object_get(val, "data_offsets");
  if (!json_is_string(jd))
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: tensor \"%s\": \"dtype\" missing or not a string", path, key);
  size_t esize = 0;
  int found = 0;
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (strcmp(json_string_value(jd), dtypes[i].name) == 0) {
      t->dtype = dtypes[i].dt;
      esize = dtypes[i].size;
      found = 1;
    }
  if (!found)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "%s: tensor \"%s\": unknown dtype \"%s\" (expected F32, F16, BF16, ...)", path,
                   key, json_string_value(jd));
  if (!json_is_array(js) || json_array_size(js) > LT_ST_MAX_DIMS)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: tensor \"%s\": \"shape\" must be an array of at most %d integers", path,
                   key, LT_ST_MAX_DIMS);
  t->ndim = (int)json_array_size(js);
  uint64_t numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    json_t *e = json_array_get(js, (size_t)d);
    if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > (1ll << 40))
      return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                     "%s: tensor \"%s\": shape[%d] is not a non-negative integer below 2^40",
                     path, key, d);
    t->shape[d] = json_integer_value(e);
    if (t->shape[d] && numel > (UINT64_MAX >> 1) / (uint64_t)t->shape[d])
      return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: tensor \"%s\": shape overflows",
                     path, key);
    numel *= (uint64_t)t->shape[d];
  }
  if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
      !json_is_integer(json_array_get(jo, 1)))
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: tensor \"%s\": \"data_offsets\" must be [begin, end]", path, key);
  json_int_t b = json_integer_value(json_array_get(jo, 0)),
             e = json_integer_value(json_array_get(jo, 1));
  if (b < 0 || e < b || (uint64_t)e > data_size)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: tensor \"%s\": data_offsets [%lld, %lld] out of range: the data section "
                   "has %llu bytes",
                   path, key, (long long)b, (long long)e, (unsigned long long)data_size);
  if (numel > UINT64_MAX / esize || (uint64_t)(e - b) != numel * esize)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: tensor \"%s\": data_offsets span %lld bytes but dtype %s and shape need "
                   "%llu",
                   path, key, (long long)(e - b), json_string_value(jd),
                   (unsigned long long)(numel * esize));
  *numel_out = numel;
  *b_out = b;
  *e_out = e;
  return LT_OK;
}

/* Appends tensor t (name copied from key) to st. 0, or -1 when out of memory. */
static int st_append(lt_st_t *st, const char *key, lt_st_tensor_t t) {
  if (st->ntensors == st->cap) {
    size_t nc = st->cap ? st->cap * 2 : 64;
    lt_st_tensor_t *nt = realloc(st->tensors, nc * sizeof *nt);
    if (!nt) return -1;
    st->tensors = nt;
    char **nn = realloc(st->names, nc * sizeof *nn);
    if (!nn) return -1;
    st->names = nn;
    st->cap = nc;
  }
  char *name = strdup(key);
  if (!name) return -1;
  t.name = name;
  st->names[st->ntensors] = name;
  st->tensors[st->ntensors++] = t;
  return 0;
}

/* Refuses two tensors of one file whose byte ranges overlap (empty ranges never do). */
static lt_err_t st_check_overlap(const lt_st_t *st, const char *path, span_t *spans,
                                 size_t nspans, char *errstr, size_t errstr_size) {
  qsort(spans, nspans, sizeof *spans, span_cmp);
  /* Sorted by begin: a span overlaps an earlier one iff it starts before the furthest end. */
  size_t far = 0;
  for (size_t i = 1; i < nspans; i++) {
    if (spans[i].end > spans[i].begin && spans[i].begin < spans[far].end)
      return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                     "%s: tensors \"%s\" and \"%s\" overlap (bytes %llu..%llu and %llu..%llu)",
                     path, st->tensors[spans[far].idx].name, st->tensors[spans[i].idx].name,
                     (unsigned long long)spans[far].begin, (unsigned long long)spans[far].end,
                     (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end);
    if (spans[i].end > spans[far].end) far = i;
  }
  return LT_OK;
}

/* Maps one file and appends its tensors to st. */
static lt_err_t st_add_file(lt_st_t *st, const char *path, char *errstr, size_t errstr_size) {
  lt_st_file_t *f = NULL;
  lt_err_t err = st_map_file(st, path, &f, errstr, errstr_size);
  if (err) return err;
  json_t *root = NULL;
  span_t *spans = NULL;
  const unsigned char *base = f->map;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
  if (hlen > LT_ST_MAX_HEADER)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: header length %llu exceeds the limit of %u bytes", path,
                   (unsigned long long)hlen, LT_ST_MAX_HEADER);
  if (hlen > f->size - 8)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "%s: header length %llu goes beyond the end of the file (%zu bytes)", path,
                   (unsigned long long)hlen, f->size);
  const unsigned char *data = base + 8 + hlen;
  uint64_t data_size = f->size - 8 - hlen;

  json_error_t jerr;
  root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: header is not valid JSON: %s at %d",
                   path, jerr.text, jerr.position);
  if (!json_is_object(root)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: header is not a JSON object", path);
    goto out;
  }
  size_t n = json_object_size(root);
  spans = calloc(n ? n : 1, sizeof *spans);
  if (!spans) {
    err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: out of memory", path);
    goto out;
  }
  size_t nspans = 0;
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(val)) {
        err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: __metadata__ is not an object",
                      path);
        goto out;
      }
      continue;
    }
    lt_st_tensor_t t = {0};
    uint64_t numel = 0;
    json_int_t b = 0, e = 0;
    if ((err = st_parse_entry(path, key, val, data_size, &t, &numel, &b, &e, errstr,
                              errstr_size)))
      goto out;
    if (lt_st_find(st, key)) {
      err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                    "%s: tensor \"%s\" appears in two files of the model", path, key);
      goto out;
    }
    t.file = f->path;
    t.numel = (int64_t)numel;
    t.data = data + b;
    t.nbytes = (size_t)(e - b);
    if (st_append(st, key, t)) {
      err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: out of memory", path);
      goto out;
    }
    spans[nspans++] = (span_t){(uint64_t)b, (uint64_t)e, st->ntensors - 1};
  }
  err = st_check_overlap(st, path, spans, nspans, errstr, errstr_size);
out:
  json_decref(root);
  free(spans);
  return err;
}

lt_err_t lt_st_open_file(const char *path, lt_st_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  lt_st_t *st = calloc(1, sizeof *st);
  if (!st) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  lt_err_t err = st_add_file(st, path, errstr, errstr_size);
  if (err) {
    lt_st_close(st);
    return err;
  }
  *out = st;
  return LT_OK;
}

lt_err_t lt_st_open_dir(const char *dir, lt_st_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  if (access(path, F_OK) != 0) {
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return lt_st_open_file(path, out, errstr, errstr_size);
  }
  lt_err_t err = LT_OK;
  json_error_t jerr;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "%s: not valid JSON: %s (line %d)", path,
                   jerr.text, jerr.line);
  json_t *wm = json_object_get(root, "weight_map");
  lt_st_t *st = calloc(1, sizeof *st);
  if (!st) {
    json_decref(root);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  }
  if (!json_is_object(wm)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                  "%s: \"weight_map\" missing or not an object", path);
    goto out;
  }
  /* Open each distinct shard once. */
  const char *key;
  json_t *val;
  json_object_foreach(wm, key, val) {
    if (!json_is_string(val) || strchr(json_string_value(val), '/') ||
        strcmp(json_string_value(val), "..") == 0) {
      err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                    "%s: weight_map[\"%s\"] must be a file name in the model directory", path,
                    key);
      goto out;
    }
    char shard[4096];
    snprintf(shard, sizeof shard, "%s/%s", dir, json_string_value(val));
    int seen = 0;
    for (size_t i = 0; i < st->nfiles; i++)
      if (strcmp(st->files[i].path, shard) == 0) seen = 1;
    if (!seen && (err = st_add_file(st, shard, errstr, errstr_size))) goto out;
  }
  json_object_foreach(wm, key, val) {
    const lt_st_tensor_t *t = lt_st_find(st, key);
    if (!t) {
      err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                    "%s: tensor \"%s\" is listed in the index but absent from %s/%s", path, key,
                    dir, json_string_value(val));
      goto out;
    }
  }
out:
  json_decref(root);
  if (err) {
    lt_st_close(st);
    return err;
  }
  *out = st;
  return LT_OK;
}

lt_err_t lt_st_get_f32(const lt_st_t *st, const char *name, int ndim, const int64_t *shape,
                       const float **data, float **owned, char *errstr, size_t errstr_size) {
  *data = NULL;
  *owned = NULL;
  const lt_st_tensor_t *t = lt_st_find(st, name);
  if (!t)
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "%s: tensor \"%s\" is missing",
                   st->nfiles ? st->files[0].path : "(model)", name);
  int same = t->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same) {
    char want[128] = "", got[128] = "";
    size_t wl = 0, gl = 0;
    for (int d = 0; d < ndim && wl < sizeof want - 24; d++)
      wl += (size_t)snprintf(want + wl, sizeof want - wl, "%s%lld", d ? ", " : "",
                             (long long)shape[d]);
    for (int d = 0; d < t->ndim && gl < sizeof got - 24; d++)
      gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%lld", d ? ", " : "",
                             (long long)t->shape[d]);
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s: tensor \"%s\" has shape [%s], expected [%s]", t->file, name, got, want);
  }
  if (t->dtype == LT_ST_F32 && ((uintptr_t)t->data & 3) == 0) {
    *data = t->data;
    return LT_OK;
  }
  if (t->dtype != LT_ST_F32 && t->dtype != LT_ST_F16 && t->dtype != LT_ST_BF16)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "%s: tensor \"%s\" has dtype %s, expected F32, F16 or BF16", t->file, name,
                   lt_st_dtype_name(t->dtype));
  float *buf = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
  if (!buf)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "%s: tensor \"%s\": out of memory",
                   t->file, name);
  const unsigned char *src = t->data;
  for (int64_t i = 0; i < t->numel; i++) {
    if (t->dtype == LT_ST_F32) {
      memcpy(&buf[i], src + 4 * i, 4);
    } else {
      uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
      buf[i] = t->dtype == LT_ST_F16 ? lt_st_f16_to_f32(h) : lt_st_bf16_to_f32(h);
    }
  }
  *data = buf;
  *owned = buf;
  return LT_OK;
}

/* ---- writing ---------------------------------------------------------------------------- */

static lt_err_t write_all(FILE *fp, const void *p, size_t n) {
  return fwrite(p, 1, n, fp) == n ? LT_OK : LT_ERR_IO;
}

/* The JSON header of a file holding `entries` in order, dumped compact into *hdr_out. */
static lt_err_t st_header(const char *path, const lt_st_entry_t *entries, size_t n,
                          char **hdr_out, char *errstr, size_t errstr_size) {
  lt_err_t err = LT_OK;
  json_t *root = json_object();
  if (!root) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  json_t *meta = json_pack("{s:s}", "format", "pt");
  json_object_set_new(root, "__metadata__", meta);
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const lt_st_entry_t *e = &entries[i];
    size_t es = lt_st_dtype_size(e->dtype);
    if (e->dtype != LT_ST_F32 && e->dtype != LT_ST_F16 && e->dtype != LT_ST_BF16) {
      err = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                    "%s: tensor \"%s\": can only write F32, F16 or BF16", path, e->name);
      goto out;
    }
    if (json_object_get(root, e->name)) {
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: tensor \"%s\" given twice", path,
                    e->name);
      goto out;
    }
    json_t *shape = json_array();
    uint64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) {
      json_array_append_new(shape, json_integer(e->shape[d]));
      numel *= (uint64_t)e->shape[d];
    }
    json_t *t = json_pack("{s:s,s:o,s:[I,I]}", "dtype", lt_st_dtype_name(e->dtype), "shape",
                          shape, "data_offsets", (json_int_t)off,
                          (json_int_t)(off + numel * es));
    if (!t || json_object_set_new(root, e->name, t) != 0) {
      err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
      goto out;
    }
    off += numel * es;
  }
  *hdr_out = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (!*hdr_out) err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
out:
  json_decref(root);
  return err;
}

/* Writes one tensor's data: F32 as is, F16/BF16 converted through a small buffer. */
static lt_err_t st_write_tensor(FILE *fp, const lt_st_entry_t *e) {
  lt_err_t err = LT_OK;
  uint64_t numel = 1;
  for (int d = 0; d < e->ndim; d++) numel *= (uint64_t)e->shape[d];
  if (e->dtype == LT_ST_F32) return write_all(fp, e->data, numel * 4);
  unsigned char buf[4096];
  size_t k = 0;
  for (uint64_t j = 0; !err && j < numel; j++) {
    uint16_t h = e->dtype == LT_ST_F16 ? lt_st_f32_to_f16(e->data[j])
                                       : lt_st_f32_to_bf16(e->data[j]);
    buf[k++] = (unsigned char)(h & 0xff);
    buf[k++] = (unsigned char)(h >> 8);
    if (k == sizeof buf) {
      err = write_all(fp, buf, k);
      k = 0;
    }
  }
  if (!err && k) err = write_all(fp, buf, k);
  return err;
}

lt_err_t lt_st_write(const char *path, const lt_st_entry_t *entries, size_t n, char *errstr,
                     size_t errstr_size) {
  char *hdr = NULL;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  lt_err_t err = st_header(path, entries, n, &hdr, errstr, errstr_size);
  if (err) return err;
  size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
  FILE *fp = fopen(tmp, "wb");
  if (!fp) {
    err = lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    goto out;
  }
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  err = write_all(fp, len8, 8);
  if (!err) err = write_all(fp, hdr, hl);
  for (size_t i = hl; !err && i < padded; i++) err = write_all(fp, " ", 1);
  for (size_t i = 0; !err && i < n; i++) err = st_write_tensor(fp, &entries[i]);
  if (!err && (fflush(fp) != 0 || fsync(fileno(fp)) != 0)) err = LT_ERR_IO;
  if (fclose(fp) != 0 && !err) err = LT_ERR_IO;
  if (err) {
    lt_errf(errstr, errstr_size, err, "%s: write failed: %s", tmp, strerror(errno));
    unlink(tmp);
    goto out;
  }
  if (rename(tmp, path) != 0) {
    err = lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
    unlink(tmp);
  }
out:
  free(hdr);
  return err;
}
