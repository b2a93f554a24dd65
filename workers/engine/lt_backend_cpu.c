/* lt_backend_cpu: the cpu implementation of lt_backend.h.
 *
 * Matrix products go to OpenBLAS (cblas_sgemm) set to one thread; parallelism comes from our
 * own fixed-size thread pool (lt_cpu_pool.h), which splits every op into `threads` static
 * chunks, so the partition (and thus every floating-point reduction order) depends only on the
 * shapes and the thread count: runs are bitwise reproducible. Owning all threads (rather than
 * letting OpenBLAS spin its own next to ours) keeps two pools from fighting over the cores.
 *
 * Loops are written plainly for gcc to vectorise (this file is built with -O3 and portable
 * flags); exp() uses a branch-free polynomial (lt_fexp). SwiGLU and the cross-entropy's rows
 * are lt_cpu_ew's, cloned per instruction set. */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_backend.h"
#include "lt_cpu_amx.h"
#include "lt_cpu_attn.h"
#include "lt_cpu_dot.h"
#include "lt_cpu_ew.h"
#include "lt_cpu_fexp.h"
#include "lt_cpu_pool.h"
#include "lt_safetensors.h" /* lt_st_f32_to_bf16: the bf16 copies of mapped weights */

/* OpenBLAS's own setter (declared in its cblas.h on Debian, repeated for other layouts). */
void openblas_set_num_threads(int num_threads);

typedef struct cpu {
  lt_backend_t be;
  int nt;
  lt_cpu_pool_t pool; /* nt threads, the caller's included */
  bool pooled;        /* pool started */
  struct lane *lanes; /* [nt] */
  char err[256];
  /* allocation list for destroy() */
  struct blk *blocks;
  /* bf16 copies of mapped weights (lt_cpu_opts_t.bf16_weights), sorted by address */
  int bf16;
  size_t bf16_min;
  bool wide; /* matmul_rows: the AVX-512 kernels (lt_cpu_opts_t.narrow unset, and the chip has them) */
  bool avx2; /* otherwise: the AVX2 build of the narrow kernels (the chip has AVX2) */
  bool bfdp; /* wide, and the chip has AVX-512 BF16: bf16 products run vdpbf16ps */
  /* the activation rows of a bf16 product, rounded (bf16_rows); grows, never shrinks */
  uint16_t *abf;
  size_t abf_n;
  /* attention backward: the dk, dv of query-tile ranges after the first (cpu_attn_bwd); grows */
  float *attn_part;
  size_t attn_part_n;
  struct shadow *sh;
  size_t nsh, capsh;
  lt_amx_t *amx; /* lt_cpu_opts_t.amx_bf16 */
} cpu_t;

/* A mapped weight [p, p + n) and its copy rounded to bf16 (nearest even), which matmul_rows
 * reads instead of the floats. */
typedef struct shadow {
  const float *p;
  size_t n;
  uint16_t *h;
} shadow_t;

/* One pool thread's scratch (attention tiles, rmsnorm dw partials), which grows at warm-up
 * only. */
typedef struct lane {
  float *scratch;
  size_t scratch_n;
} lane_t;

typedef struct blk {
  struct blk *prev, *next;
  size_t bytes;
  char pad[40]; /* header is 64 bytes so the payload keeps 64-byte alignment */
} blk_t;

/* The tid-th of nt contiguous chunks of [0, n). */
static inline void chunk(size_t n, int tid, int nt, size_t *lo, size_t *hi) {
  size_t q = n / (size_t)nt, r = n % (size_t)nt, t = (size_t)tid;
  *lo = t * q + (t < r ? t : r);
  *hi = *lo + q + (t < r);
}

static float *scratch(cpu_t *c, int tid, size_t n) {
  lane_t *ln = &c->lanes[tid];
  if (ln->scratch_n < n) {
    free(ln->scratch);
    ln->scratch = aligned_alloc(64, ((n * sizeof(float)) + 63) & ~(size_t)63);
    assert(ln->scratch && "cpu backend: scratch allocation failed");
    ln->scratch_n = n;
  }
  return ln->scratch;
}

#define CPU(be) ((cpu_t *)(be))

/* ---- memory ----------------------------------------------------------------------------- */

static const char *cpu_last_error(lt_backend_t *be) { return CPU(be)->err; }

static void *cpu_alloc(lt_backend_t *be, size_t bytes) {
  cpu_t *c = CPU(be);
  size_t total = sizeof(blk_t) + ((bytes + 63) & ~(size_t)63);
  blk_t *b = aligned_alloc(64, total);
  if (!b) {
    snprintf(c->err, sizeof c->err, "cpu backend: cannot allocate %zu bytes", bytes);
    return NULL;
  }
  memset(b, 0, total);
  b->bytes = bytes;
  b->next = c->blocks;
  if (c->blocks) c->blocks->prev = b;
  c->blocks = b;
  return b + 1;
}

static void scrub_bytes(void *p, size_t n) {
  memset(p, 0, n);
  __asm__ __volatile__("" : : "r"(p) : "memory"); /* keeps the memset */
}

static void cpu_free(lt_backend_t *be, void *p) {
  if (!p) return;
  cpu_t *c = CPU(be);
  blk_t *b = (blk_t *)p - 1;
  scrub_bytes(p, b->bytes);
  if (b->prev) b->prev->next = b->next;
  else c->blocks = b->next;
  if (b->next) b->next->prev = b->prev;
  free(b);
}

static lt_err_t cpu_upload(lt_backend_t *be, void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
  return LT_OK;
}
static lt_err_t cpu_download(lt_backend_t *be, void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
  return LT_OK;
}
/* How many shadows start at or before p (the one that may hold p is the last of them). */
static size_t shadows_upto(const cpu_t *c, const float *p) {
  size_t lo = 0, hi = c->nsh;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->sh[mid].p <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The bf16 copy of the weight element at w, or NULL when w is in no mapped weight. */
static const uint16_t *shadow_of(const cpu_t *c, const float *w) {
  size_t i = shadows_upto(c, w);
  if (i == 0 || w >= c->sh[i - 1].p + c->sh[i - 1].n) return NULL;
  return c->sh[i - 1].h + (w - c->sh[i - 1].p);
}

/* On the cpu a mapped weight is the host memory itself; with bf16_weights, weights of at least
 * bf16_min floats also get a bf16 copy, which matmul_rows reads instead (the floats stay, for
 * the other ops: embedding lookups, norms). */
static const float *cpu_map_const(lt_backend_t *be, const float *host, size_t n) {
  cpu_t *c = CPU(be);
  if (c->amx && lt_amx_add(c->amx, host, n)) return NULL;
  if (!c->bf16 || n < c->bf16_min || shadow_of(c, host)) return host;
  if (c->nsh == c->capsh) {
    size_t cap = c->capsh ? 2 * c->capsh : 64;
    shadow_t *ns = realloc(c->sh, cap * sizeof *ns);
    if (!ns) {
      snprintf(c->err, sizeof c->err, "cpu backend: map_const: out of memory");
      return NULL;
    }
    c->sh = ns;
    c->capsh = cap;
  }
  uint16_t *h = malloc(n * sizeof *h);
  if (!h) {
    snprintf(c->err, sizeof c->err, "cpu backend: map_const: no memory for a bf16 copy of %zu floats", n);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) h[i] = lt_st_f32_to_bf16(host[i]);
  size_t at = shadows_upto(c, host);
  memmove(c->sh + at + 1, c->sh + at, (c->nsh - at) * sizeof *c->sh);
  c->sh[at] = (shadow_t){host, n, h};
  c->nsh++;
  return host;
}

static void cpu_free_const(lt_backend_t *be, const float *dev) {
  cpu_t *c = CPU(be);
  lt_amx_remove(c->amx, dev);
  size_t i = shadows_upto(c, dev);
  if (i == 0 || c->sh[i - 1].p != dev) return;
  free(c->sh[i - 1].h);
  memmove(c->sh + i - 1, c->sh + i, (c->nsh - i) * sizeof *c->sh);
  c->nsh--;
}
static void cpu_grad_f32(lt_backend_t *be, const float *dev) { lt_amx_grad_f32(CPU(be)->amx, dev); }
static void cpu_scrub(lt_backend_t *be, void *p, size_t bytes) { scrub_bytes(p, bytes); }

/* ---- matmul ----------------------------------------------------------------------------- */

typedef struct mm_args {
  int ta, tb, M, N, K;
  float alpha, beta;
  const float *A, *B;
  float *C;
  int lda, ldb, ldc;
  long sa, sb, sc;
  int batch;
} mm_args_t;

/* One thread's share: whole matrices when batched, else a slab of rows (or columns when M is
 * small) of C. */
static void mm_task(void *p, int tid, int nt) {
  const mm_args_t *a = p;
  CBLAS_TRANSPOSE ta = a->ta ? CblasTrans : CblasNoTrans, tb = a->tb ? CblasTrans : CblasNoTrans;
  if (a->batch > 1) {
    size_t lo, hi;
    chunk((size_t)a->batch, tid, nt, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
      cblas_sgemm(CblasRowMajor, ta, tb, a->M, a->N, a->K, a->alpha, a->A + (long)i * a->sa,
                  a->lda, a->B + (long)i * a->sb, a->ldb, a->beta, a->C + (long)i * a->sc,
                  a->ldc);
    return;
  }
  size_t lo, hi;
  if (a->M >= a->N || a->M >= 64 * nt) {
    chunk((size_t)a->M, tid, nt, &lo, &hi);
    if (hi == lo) return;
    const float *A = a->ta ? a->A + lo : a->A + lo * (size_t)a->lda;
    cblas_sgemm(CblasRowMajor, ta, tb, (int)(hi - lo), a->N, a->K, a->alpha, A, a->lda, a->B,
                a->ldb, a->beta, a->C + lo * (size_t)a->ldc, a->ldc);
  } else {
    /* split N in multiples of 16 columns to keep the kernel's full-width tiles */
    size_t blocks = ((size_t)a->N + 15) / 16;
    chunk(blocks, tid, nt, &lo, &hi);
    lo *= 16;
    hi = hi * 16 > (size_t)a->N ? (size_t)a->N : hi * 16;
    if (hi <= lo) return;
    const float *B = a->tb ? a->B + lo * (size_t)a->ldb : a->B + lo;
    cblas_sgemm(CblasRowMajor, ta, tb, a->M, (int)(hi - lo), a->K, a->alpha, a->A, a->lda, B,
                a->ldb, a->beta, a->C + lo, a->ldc);
  }
}

static void amx_run(void *c, lt_cpu_pool_fn fn, void *arg) {
  lt_cpu_pool_run(&((cpu_t *)c)->pool, fn, arg);
}

static void cpu_matmul(lt_backend_t *be, int ta, int tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc) {
  cpu_t *c = CPU(be);
  if (M == 0 || N == 0 || (c->amx && !ta && lt_amx_matmul(c->amx, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                                          amx_run, c)))
    return;
  /* OpenBLAS assigns (not scales) C when beta == 0, so stale NaNs there are harmless */
  mm_args_t a = {ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, 0, 0, 0, 1};
  /* small products are not worth waking the pool */
  if ((double)M * N * K < 1 << 15) mm_task(&a, 0, 1);
  else lt_cpu_pool_run(&c->pool, mm_task, &a);
}

/* Batch-invariant NT product: each C element is one dot product computed by the same code
 * whatever M is; threads split the columns. W is floats, or (Wh set) the bf16 copy of a mapped
 * weight, and then Ah holds A's rows rounded to bf16 and the product is the bf16 pairs' sum of
 * lt_cpu_dot.h: half the weight bytes to stream, and on AVX-512 BF16 one instruction per 32
 * products. */
typedef struct mr_args {
  int M, N, K, lda, ldw, ldc;
  float alpha, beta;
  const float *A, *W;
  float *C;
  const uint16_t *Wh; /* NULL: read W */
  const uint16_t *Ah; /* with Wh: A's M rows rounded to bf16, K apart */
  bool wide, avx2, bfdp; /* cpu_t's */
} mr_args_t;

AI void mr_store(const mr_args_t *a, int r, size_t j, float d) {
  float *c = a->C + (size_t)r * a->ldc + j;
  *c = a->beta == 0.0f ? a->alpha * d : a->alpha * d + a->beta * *c;
}

/* M rows of A (lda apart) rounded to bf16 into dst (K apart): nearest even, and subnormals to
 * zero as vdpbf16ps reads them. */
static void bf16_rows(const float *A, int lda, int M, int K, uint16_t *dst) {
  for (int r = 0; r < M; r++)
    for (int k = 0; k < K; k++) {
      float f = A[(size_t)r * lda + k];
      uint32_t u;
      memcpy(&u, &f, sizeof u);
      dst[(size_t)r * K + k] = (u & 0x7f800000u) == 0 ? (uint16_t)((u >> 16) & 0x8000u) : lt_st_f32_to_bf16(f);
    }
}

/* Room for n rounded activations in c->abf. */
static uint16_t *abf_room(cpu_t *c, size_t n) {
  if (c->abf_n < n) {
    free(c->abf);
    c->abf = malloc(n * sizeof *c->abf);
    assert(c->abf && "cpu backend: bf16 activation buffer allocation failed");
    c->abf_n = n;
  }
  return c->abf;
}

/* How many blocks of four weight rows ahead a bf16 tile prefetches (bdot_tile's pf). */
#define MRB_AHEAD 2

/* Columns [lo, hi) of a bf16 product, four at a time: eight rows at a time as two 8x2 tiles
 * (each weight chunk loaded once for eight rows: a batch of eight decoding streams the weights
 * once, with the products between the loads — 8 % more decode tokens/s than two 4x4 tiles, one
 * streaming and one from L1), then 4x4 tiles, then the rows left against four columns; then the
 * columns left one element at a time; every element summed alike (lt_cpu_dot.h). */
AI void mrb_cols_of(const mr_args_t *a, size_t lo, size_t hi, ldp_fn ld, bstep_fn step, bfold_fn fold) {
  const size_t ldw = (size_t)a->ldw, lda = (size_t)a->K;
  size_t j = lo;
  for (; j + 4 <= hi; j += 4) {
    const uint16_t *w = a->Wh + j * ldw;
    /* the first tile of these columns fetches the columns MRB_AHEAD blocks on */
    const uint16_t *pf = j + 4 * MRB_AHEAD + 4 <= hi ? w + 4 * MRB_AHEAD * ldw : NULL;
    int r = 0;
    for (; r + 8 <= a->M; r += 8) /* weights streamed once, products between the loads */
      for (size_t q = 0; q < 4; q += 2) {
        float d[16];
        const uint16_t *pq = r == 0 && pf ? pf + q * ldw : NULL;
        bdot_tile82(a->Ah + r * lda, lda, w + q * ldw, ldw, a->K, pq, ld, step, fold, d);
        for (int i = 0; i < 16; i++) mr_store(a, r + i / 2, j + q + (size_t)(i % 2), d[i]);
      }
    for (; r + 4 <= a->M; r += 4) {
      float d[16];
      bdot_tile(a->Ah + r * lda, lda, w, ldw, a->K, 4, 4, r == 0 ? pf : NULL, ld, step, fold, d);
      for (int i = 0; i < 16; i++) mr_store(a, r + i / 4, j + (size_t)(i % 4), d[i]);
    }
    for (; r < a->M; r++) {
      float d[4];
      bdot_tile(a->Ah + r * lda, lda, w, ldw, a->K, 1, 4, r == 0 ? pf : NULL, ld, step, fold, d);
      for (int q = 0; q < 4; q++) mr_store(a, r, j + (size_t)q, d[q]);
    }
  }
  for (; j < hi; j++)
    for (int r = 0; r < a->M; r++) {
      float d;
      bdot_tile(a->Ah + r * lda, lda, a->Wh + j * ldw, ldw, a->K, 1, 1, NULL, ld, step, fold, &d);
      mr_store(a, r, j, d);
    }
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void mrb_cols_avx512(const mr_args_t *a, size_t lo, size_t hi) {
  mrb_cols_of(a, lo, hi, ldp_avx512, bstep_avx512, bfold_avx512);
}

__attribute__((target("avx2")))
static void mrb_cols_avx2(const mr_args_t *a, size_t lo, size_t hi) {
  mrb_cols_of(a, lo, hi, ldp, bstep, bfold);
}

static void mrb_cols_base(const mr_args_t *a, size_t lo, size_t hi) { mrb_cols_of(a, lo, hi, ldp, bstep, bfold); }

/* Four rows (x, x + lda, ...) against four weight rows (b, b + ldb, ...): a 4x4 tile of the
 * product in sixteen 16-lane sums (out[4 * row + col]), each weight and activation vector loaded
 * once for four sums; each element summed exactly as dot16 sums it. Sixteen accumulators fit
 * AVX-512's 32 registers, not AVX2's 16, so only the AVX-512 build tiles. */
AI void dot16t44(const float *x, size_t lda, const float *b, size_t ldb, int K, ldw_fn ld, float out[16]) {
  const float *xr[4] = {x, x + lda, x + 2 * lda, x + 3 * lda};
  const float *br[4] = {b, b + ldb, b + 2 * ldb, b + 3 * ldb};
  v16f v[16] = {{0}};
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    v16f w0 = ld(br[0], k), w1 = ld(br[1], k), w2 = ld(br[2], k), w3 = ld(br[3], k);
    for (int r = 0; r < 4; r++) {
      v16f a = ld16(xr[r] + k);
      v[4 * r] += a * w0;
      v[4 * r + 1] += a * w1;
      v[4 * r + 2] += a * w2;
      v[4 * r + 3] += a * w3;
    }
  }
  for (int r = 0; r < 4; r++)
    for (int q = 0; q < 4; q++) out[4 * r + q] = finish16(v[4 * r + q], xr[r], br[q], k, K);
}

/* Columns [lo, hi) of a float product; tile: 4x4 tiles where four rows and four columns remain
 * (dot16t44). */
AI void mr_cols_of(const mr_args_t *a, size_t lo, size_t hi, bool tile, ldw_fn ld) {
  size_t j = lo;
  const size_t ldw = (size_t)a->ldw;
  if (a->M < 4 || tile) /* four weight rows at a time: decoding a few rows, or tiles */
    for (; j + 4 <= hi; j += 4) {
      int r = 0;
      if (tile)
        for (; r + 4 <= a->M; r += 4) {
          float d[16];
          dot16t44(a->A + (size_t)r * a->lda, (size_t)a->lda, a->W + j * ldw, ldw, a->K, ld, d);
          for (int i = 0; i < 16; i++) mr_store(a, r + i / 4, j + (size_t)(i % 4), d[i]);
        }
      for (; r < a->M; r++) {
        float d[4];
        dot16w4(a->A + (size_t)r * a->lda, a->W + j * ldw, ldw, a->K, ld, d);
        for (int q = 0; q < 4; q++) mr_store(a, r, j + (size_t)q, d[q]);
      }
    }
  for (; j < hi; j++) {
    const float *w = a->W + j * ldw;
    int r = 0;
    for (; r + 4 <= a->M; r += 4) {
      const float *x = a->A + (size_t)r * a->lda;
      float d[4];
      dot16x4(x, x + a->lda, x + 2 * (size_t)a->lda, x + 3 * (size_t)a->lda, w, a->K, ld, d);
      for (int q = 0; q < 4; q++) mr_store(a, r + q, j, d[q]);
    }
    for (; r < a->M; r++) mr_store(a, r, j, dot16(a->A + (size_t)r * a->lda, w, a->K, ld));
  }
}

/* Built for AVX-512 (tiled), AVX2 and the x86-64 baseline, and picked at run time. The wider
 * sets bring wider registers, not FMA: a multiply and an add stay two roundings (no contraction:
 * -ffp-contract=off for this file), and every element is the same 16-lane sum, tiled or not, so
 * every build gives the same bits (the sampler's answers do not depend on the machine's
 * instruction set). */
__attribute__((target("avx512f")))
static void mr_cols_avx512(const mr_args_t *a, size_t lo, size_t hi) { mr_cols_of(a, lo, hi, true, ldw_avx512); }

/* Picked by a flag, not target_clones: an ifunc resolver runs during relocation, before a
 * sanitizer's runtime is up, and ThreadSanitizer builds crashed there. */
__attribute__((target("avx2")))
static void mr_cols_avx2(const mr_args_t *a, size_t lo, size_t hi) { mr_cols_of(a, lo, hi, false, ldw); }

static void mr_cols_base(const mr_args_t *a, size_t lo, size_t hi) { mr_cols_of(a, lo, hi, false, ldw); }

static void mr_cols(const mr_args_t *a, size_t lo, size_t hi) {
  if (a->Wh) {
    unsigned csr = bf16_csr_enter();
    if (a->bfdp) mrb_cols_avx512(a, lo, hi);
    else if (a->avx2) mrb_cols_avx2(a, lo, hi);
    else mrb_cols_base(a, lo, hi);
    bf16_csr_leave(csr);
  } else if (a->wide) mr_cols_avx512(a, lo, hi);
  else if (a->avx2) mr_cols_avx2(a, lo, hi);
  else mr_cols_base(a, lo, hi);
}

/* The arguments of one product; Ah: where its rounded rows go when W has a bf16 copy (then
 * *used grows by M*K), else unused. */
static mr_args_t mr_args_of(const cpu_t *c, const lt_mr_desc_t *d, uint16_t *Ah, size_t *used) {
  mr_args_t a = {d->M, d->N, d->K, d->lda, d->ldw, d->ldc, d->alpha, d->beta, d->A, d->W, d->C,
                 shadow_of(c, d->W), NULL, c->wide, c->avx2, c->bfdp};
  if (a.Wh) {
    a.Ah = Ah + *used;
    *used += (size_t)d->M * d->K;
  }
  return a;
}

/* matmul_rows_multi: each thread takes its share of every product's columns. */
typedef struct mrm_args {
  const cpu_t *c;
  int count;
  const lt_mr_desc_t *d;
} mrm_args_t;

static void mrm_task(void *p, int tid, int nt) {
  const mrm_args_t *m = p;
  size_t used = 0;
  for (int i = 0; i < m->count; i++) {
    mr_args_t a = mr_args_of(m->c, &m->d[i], m->c->abf, &used);
    size_t lo, hi;
    chunk((size_t)a.N, tid, nt, &lo, &hi);
    mr_cols(&a, lo, hi);
  }
}

/* Rounds the activations of every product of d that reads a bf16 copy into c->abf, in the
 * order mr_args_of hands them out. */
static void bf16_prepare(cpu_t *c, int count, const lt_mr_desc_t *d) {
  if (!c->bf16) return;
  size_t n = 0;
  for (int i = 0; i < count; i++)
    if (shadow_of(c, d[i].W)) n += (size_t)d[i].M * d[i].K;
  if (n == 0) return;
  uint16_t *ah = abf_room(c, n);
  size_t used = 0;
  for (int i = 0; i < count; i++) {
    mr_args_t a = mr_args_of(c, &d[i], ah, &used);
    if (a.Wh) bf16_rows(a.A, a.lda, a.M, a.K, (uint16_t *)a.Ah);
  }
}

static void cpu_matmul_rows_multi(lt_backend_t *be, int count, const lt_mr_desc_t *d) {
  double flops = 0;
  for (int i = 0; i < count; i++) flops += (double)d[i].M * d[i].N * d[i].K;
  bf16_prepare(CPU(be), count, d);
  mrm_args_t m = {CPU(be), count, d};
  if (flops < 1 << 15) mrm_task(&m, 0, 1);
  else lt_cpu_pool_run(&CPU(be)->pool, mrm_task, &m);
}

static void cpu_matmul_rows(lt_backend_t *be, int M, int N, int K, float alpha, const float *A,
                            int lda, const float *W, int ldw, float beta, float *C, int ldc) {
  lt_mr_desc_t d = {.M = M, .N = N, .K = K, .alpha = alpha, .beta = beta, .A = A, .lda = lda,
                    .W = W, .ldw = ldw, .C = C, .ldc = ldc};
  cpu_matmul_rows_multi(be, 1, &d);
}

static void cpu_matmul_strided(lt_backend_t *be, int ta, int tb, int M, int N, int K,
                               float alpha, const float *A, int lda, long sa, const float *B,
                               int ldb, long sb, float beta, float *C, int ldc, long sc,
                               int batch) {
  if (batch <= 0) return;
  if (batch == 1) {
    cpu_matmul(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  mm_args_t a = {ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, sa, sb, sc, batch};
  lt_cpu_pool_run(&CPU(be)->pool, mm_task, &a);
}

/* ---- elementwise ------------------------------------------------------------------------ */

typedef struct ew_args {
  float *x, *y, *z;
  const float *a, *b, *c, *d;
  const int32_t *ia, *ib;
  int rows, cols, i1, i2, i3, i4;
  float f1, f2, f3, f4, f5, f6;
  long l1;
  uint64_t u1;
  double *partial;
  cpu_t *cpu;
} ew_t;

/* An elementwise task: items (or rows) [lo, hi) of its op, on pool thread tid. */
typedef void (*ew_fn)(const ew_t *e, size_t lo, size_t hi, int tid);

typedef struct ew_job {
  ew_fn fn;
  const ew_t *e;
  size_t span;
} ew_job_t;

static void ew_job_task(void *p, int tid, int nt) {
  const ew_job_t *j = p;
  size_t lo, hi;
  chunk(j->span, tid, nt, &lo, &hi);
  j->fn(j->e, lo, hi, tid);
}

/* Runs fn over [0, span) split into the pool's static chunks. */
static void ew_run(lt_backend_t *be, ew_fn fn, const ew_t *e, size_t span) {
  ew_job_t j = {fn, e, span};
  lt_cpu_pool_run(&CPU(be)->pool, ew_job_task, &j);
}

/* Below this many elements an elementwise op runs on the caller alone: waking the pool costs
 * more than the op (a decode step of one sequence runs a few hundred ops of a few hundred
 * floats). Only for ops whose every row or element is computed the same whichever thread and
 * chunk it falls in, so the answer does not depend on the size of the batch. */
#define EW_INLINE 16384

static void ew_run_small(lt_backend_t *be, ew_fn fn, const ew_t *e, size_t span, size_t elems) {
  if (elems < EW_INLINE) fn(e, 0, span, 0);
  else ew_run(be, fn, e, span);
}

static void zero_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  memset(e->x + lo, 0, (hi - lo) * sizeof(float));
}
static void cpu_zero(lt_backend_t *be, float *x, size_t n) {
  ew_t e = {.x = x};
  if (n < 65536) zero_task(&e, 0, n, 0);
  else ew_run(be, zero_task, &e, n);
}

static void cpu_copy(lt_backend_t *be, float *dst, const float *src, size_t n) {
  memcpy(dst, src, n * sizeof(float));
}

static void scale_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  float *x = e->x, a = e->f1;
  for (size_t i = lo; i < hi; i++) x[i] *= a;
}
static void cpu_scale(lt_backend_t *be, float *x, float a, size_t n) {
  ew_t e = {.x = x, .f1 = a};
  if (n < 65536) scale_task(&e, 0, n, 0);
  else ew_run(be, scale_task, &e, n);
}

static void axpy_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  float *y = e->x, a = e->f1;
  const float *x = e->a;
  for (size_t i = lo; i < hi; i++) y[i] += a * x[i];
}
static void cpu_axpy(lt_backend_t *be, float *y, float a, const float *x, size_t n) {
  ew_t e = {.x = y, .a = x, .f1 = a};
  if (n < 65536) axpy_task(&e, 0, n, 0);
  else ew_run(be, axpy_task, &e, n);
}

static void sumsq_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  const float *x = e->a;
  double s = 0;
  /* 8 float lanes of partial sums per 1024-block, then double: fixed order, vectorisable */
  for (size_t i = lo; i < hi; i += 1024) {
    size_t end = i + 1024 < hi ? i + 1024 : hi;
    float acc = 0;
    for (size_t j = i; j < end; j++) acc += x[j] * x[j];
    s += acc;
  }
  e->partial[tid] = s;
}
static double cpu_sumsq(lt_backend_t *be, const float *x, size_t n) {
  cpu_t *c = CPU(be);
  double partial[c->nt];
  ew_t e = {.a = x, .partial = partial};
  ew_run(be, sumsq_task, &e, n);
  double s = 0;
  for (int t = 0; t < c->nt; t++) s += partial[t];
  return s;
}

static void cpu_bias_add(lt_backend_t *be, float *y, const float *b, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    float *yr = y + (size_t)r * cols;
    for (int j = 0; j < cols; j++) yr[j] += b[j];
  }
}

static void cpu_bias_bwd(lt_backend_t *be, float *db, const float *dy, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    const float *d = dy + (size_t)r * cols;
    for (int j = 0; j < cols; j++) db[j] += d[j];
  }
}

static void dropout_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  float keep = 1.0f / (1.0f - e->f1);
  for (size_t i = lo; i < hi; i++)
    e->x[i] = lt_backend_dropout_keep(e->u1, i, e->f1) ? e->a[i] * keep : 0.0f;
}
static void cpu_dropout(lt_backend_t *be, float *out, const float *in, size_t n, float p,
                        uint64_t seed) {
  if (p <= 0.0f) {
    if (out != in) memmove(out, in, n * sizeof(float));
    return;
  }
  ew_t e = {.x = out, .a = in, .f1 = p, .u1 = seed};
  ew_run(be, dropout_task, &e, n);
}

/* ---- embedding -------------------------------------------------------------------------- */

static void cpu_embed_fwd(lt_backend_t *be, float *out, const float *table,
                          const int32_t *tokens, int N, int D) {
  for (int r = 0; r < N; r++)
    memcpy(out + (size_t)r * D, table + (size_t)tokens[r] * D, (size_t)D * sizeof(float));
}

static void embed_bwd_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  for (int r = 0; r < e->rows; r++) {
    float *d = e->x + (size_t)e->ia[r] * e->cols;
    const float *g = e->a + (size_t)r * e->cols;
    for (size_t j = lo; j < hi; j++) d[j] += g[j];
  }
}
static void cpu_embed_bwd(lt_backend_t *be, float *dtable, const float *dout,
                          const int32_t *tokens, int N, int D) {
  ew_t e = {.x = dtable, .a = dout, .ia = tokens, .rows = N, .cols = D};
  ew_run(be, embed_bwd_task, &e, (size_t)D);
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

static void rms_fwd_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  int D = e->cols;
  for (size_t r = lo; r < hi; r++) {
    const float *x = e->a + r * D;
    float *y = e->x + r * D;
    float ss = 0;
    for (int j = 0; j < D; j++) ss += x[j] * x[j];
    float rs = 1.0f / sqrtf(ss / (float)D + e->f1);
    if (e->y) e->y[r] = rs;
    for (int j = 0; j < D; j++) y[j] = x[j] * rs * e->b[j];
  }
}
static void cpu_rmsnorm_fwd(lt_backend_t *be, float *out, float *rstd, const float *x,
                            const float *w, int N, int D, float eps) {
  ew_t e = {.x = out, .y = rstd, .a = x, .b = w, .cols = D, .f1 = eps};
  ew_run_small(be, rms_fwd_task, &e, (size_t)N, (size_t)N * (size_t)D);
}

static void rms_bwd_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  cpu_t *c = e->cpu;
  int D = e->cols;
  float *dwp = NULL;
  if (e->y) {
    dwp = scratch(c, tid, (size_t)D);
    memset(dwp, 0, (size_t)D * sizeof(float));
  }
  const float *w = e->b;
  for (size_t r = lo; r < hi; r++) {
    const float *x = e->c + r * D, *dy = e->a + r * D;
    float *dx = e->x + r * D;
    float rs = e->d[r];
    float dot = 0;
    for (int j = 0; j < D; j++) dot += dy[j] * w[j] * x[j];
    float k = rs * rs * rs * dot / (float)D;
    for (int j = 0; j < D; j++) dx[j] += rs * w[j] * dy[j] - k * x[j];
    if (dwp)
      for (int j = 0; j < D; j++) dwp[j] += dy[j] * x[j] * rs;
  }
}
static void cpu_rmsnorm_bwd(lt_backend_t *be, float *dx, float *dw, const float *dout,
                            const float *x, const float *w, const float *rstd, int N, int D) {
  cpu_t *c = CPU(be);
  ew_t e = {.x = dx, .y = dw, .cpu = c, .a = dout, .b = w, .c = x, .d = rstd, .cols = D};
  ew_run(be, rms_bwd_task, &e, (size_t)N);
  if (dw) /* per-thread partials summed in thread order */
    for (int t = 0; t < c->nt; t++)
      for (int j = 0; j < D; j++) dw[j] += c->lanes[t].scratch[j];
}

/* ---- RoPE ------------------------------------------------------------------------------- */

static void rope_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  int nh = e->i1, hd = e->i2, half = hd / 2;
  float sign = e->i3 ? -1.0f : 1.0f;
  for (size_t r = lo; r < hi; r++) {
    const float *cs = e->a + (size_t)e->ia[r] * half, *sn = e->b + (size_t)e->ia[r] * half;
    for (int h = 0; h < nh; h++) {
      float *x = e->x + (r * nh + h) * hd;
      for (int j = 0; j < half; j++) {
        float x1 = x[j], x2 = x[j + half], s = sign * sn[j];
        x[j] = x1 * cs[j] - x2 * s;
        x[j + half] = x2 * cs[j] + x1 * s;
      }
    }
  }
}
static void cpu_rope(lt_backend_t *be, float *x, const float *cos_tab, const float *sin_tab,
                     const int32_t *pos, int N, int nh, int hd, int inverse) {
  ew_t e = {.x = x, .a = cos_tab, .b = sin_tab, .ia = pos, .i1 = nh, .i2 = hd,
            .i3 = inverse};
  ew_run_small(be, rope_task, &e, (size_t)N, (size_t)N * (size_t)nh * (size_t)hd);
}

/* ---- attention -------------------------------------------------------------------------- */

static size_t cpu_attn_state_floats(lt_backend_t *be, int B, int T, int H) {
  return (size_t)B * H * T * 2; /* each row's softmax max and 1/sum (lt_cpu_attn.h) */
}

typedef struct attn_args {
  float *out, *st, *dq, *dk, *dv;
  float *part; /* backward: range p >= 1 adds its dk, dv into part + (p-1) * 2 * nk */
  size_t nk;   /* floats of dk (and of dv) */
  const float *q, *k, *v, *dout, *o, *cst;
  const int32_t *pos;
  lt_cpu_attn_dims_t d;
  int parts; /* ranges of query tiles per (sequence, kv head): lt_cpu_attn_parts */
  cpu_t *c;
} attn_t;

/* One unit per (sequence, kv head, range of query tiles); each writes only its own rows. */
static void attn_fwd_task(void *p, int tid, int nt) {
  attn_t *a = p;
  float *scr = scratch(a->c, tid, lt_cpu_attn_scratch(LT_CPU_ATTN_TILE, a->d.hd, a->d.H / a->d.KV, a->d.T));
  size_t lo, hi;
  chunk((size_t)a->d.B * a->d.KV * a->parts, tid, nt, &lo, &hi);
  for (size_t u = lo; u < hi; u++) {
    int b, kv, qt0, qt1, part;
    lt_cpu_attn_unit(a->d, LT_CPU_ATTN_TILE, a->pos, a->parts, u, &b, &kv, &qt0, &qt1, &part);
    lt_cpu_attn_fwd_kv(a->d, LT_CPU_ATTN_TILE, b, kv, qt0, qt1, a->out, a->st, a->q, a->k, a->v, a->pos, scr);
  }
}
static void cpu_attn_fwd(lt_backend_t *be, float *out, float *state, const float *q,
                         const float *k, const float *v, const int32_t *pos, int B, int T, int H,
                         int KV, int hd) {
  attn_t a = {.out = out, .st = state, .q = q, .k = k, .v = v, .pos = pos,
              .d = {.B = B, .T = T, .H = H, .KV = KV, .hd = hd}, .parts = lt_cpu_attn_parts(B, KV, T, LT_CPU_ATTN_TILE),
              .c = CPU(be)};
  lt_cpu_pool_run(&CPU(be)->pool, attn_fwd_task, &a);
}

/* One unit per (sequence, kv head, range of query tiles), the g query heads sharing the kv head
 * stacked in one product per tile. The first range adds into dk and dv, range p >= 1 into a
 * buffer of its own (ranges of other sequences or kv heads share it: they write other rows or
 * columns); attn_sum_task then adds the buffers into dk and dv in range order. No atomics, and
 * the same sums whatever the thread count. */
static void attn_bwd_task(void *p, int tid, int nt) {
  attn_t *a = p;
  float *scr = scratch(a->c, tid, lt_cpu_attn_scratch(LT_CPU_ATTN_TILE, a->d.hd, a->d.H / a->d.KV, a->d.T));
  size_t lo, hi;
  chunk((size_t)a->d.B * a->d.KV * a->parts, tid, nt, &lo, &hi);
  for (size_t u = lo; u < hi; u++) {
    int b, kv, qt0, qt1, part;
    lt_cpu_attn_unit(a->d, LT_CPU_ATTN_TILE, a->pos, a->parts, u, &b, &kv, &qt0, &qt1, &part);
    float *dk = part ? a->part + (size_t)(part - 1) * 2 * a->nk : a->dk, *dv = part ? dk + a->nk : a->dv;
    lt_cpu_attn_bwd_kv(a->d, LT_CPU_ATTN_TILE, b, kv, qt0, qt1, a->dq, dk, dv, a->dout, a->q, a->k, a->v,
                       a->o, a->cst, a->pos, scr);
  }
}
static void attn_sum_task(void *p, int tid, int nt) {
  attn_t *a = p;
  size_t lo, hi;
  chunk(a->nk, tid, nt, &lo, &hi);
  for (int part = 1; part < a->parts; part++) {
    const float *pk = a->part + (size_t)(part - 1) * 2 * a->nk, *pv = pk + a->nk;
    for (size_t i = lo; i < hi; i++) {
      a->dk[i] += pk[i];
      a->dv[i] += pv[i];
    }
  }
}
static void cpu_attn_bwd(lt_backend_t *be, float *dq, float *dk, float *dv, const float *dout,
                         const float *q, const float *k, const float *v, const float *out,
                         const float *state, const int32_t *pos, int B, int T, int H, int KV,
                         int hd) {
  cpu_t *c = CPU(be);
  attn_t a = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .q = q, .k = k, .v = v, .o = out,
              .cst = state, .pos = pos, .d = {.B = B, .T = T, .H = H, .KV = KV, .hd = hd},
              .nk = (size_t)B * T * KV * hd, .parts = lt_cpu_attn_parts(B, KV, T, LT_CPU_ATTN_TILE), .c = c};
  size_t need = (size_t)(a.parts - 1) * 2 * a.nk;
  if (c->attn_part_n < need) {
    free(c->attn_part);
    c->attn_part = aligned_alloc(64, ((need * sizeof(float)) + 63) & ~(size_t)63);
    assert(c->attn_part && "cpu backend: attention buffer allocation failed");
    c->attn_part_n = need;
  }
  a.part = c->attn_part;
  memset(dk, 0, a.nk * sizeof(float));
  memset(dv, 0, a.nk * sizeof(float));
  if (need) memset(a.part, 0, need * sizeof(float));
  lt_cpu_pool_run(&c->pool, attn_bwd_task, &a);
  if (a.parts > 1) lt_cpu_pool_run(&c->pool, attn_sum_task, &a);
}

static void cpu_kv_store(lt_backend_t *be, float *cache, const float *src, const int32_t *seq,
                         const int32_t *pos, int n, int width, int max_t) {
  for (int r = 0; r < n; r++)
    memcpy(cache + ((size_t)seq[r] * max_t + pos[r]) * width, src + (size_t)r * width,
           (size_t)width * sizeof(float));
}

typedef struct cached_args {
  float *out;
  const float *q, *kc, *vc;
  const int32_t *seq, *pos;
  int n, H, KV, hd, max_t;
  cpu_t *c;
} cached_t;

/* exp((s[j] - mx) * scale) in place for j < L, in order; returns their sum. The cached and the
 * paged attention share it, so the two give the same bits for the same keys. */
static inline float softmax_scores(float *s, int L, float mx, float scale) {
  float sum = 0;
  for (int j = 0; j < L; j++) {
    s[j] = lt_fexp((s[j] - mx) * scale);
    sum += s[j];
  }
  return sum;
}

static void attn_cached_task(void *p, int tid, int nt) {
  cached_t *a = p;
  int H = a->H, KV = a->KV, hd = a->hd, g = H / KV, w = KV * hd;
  float scale = 1.0f / sqrtf((float)hd);
  float *s = scratch(a->c, tid, (size_t)a->max_t);
  size_t lo, hi;
  chunk((size_t)a->n * H, tid, nt, &lo, &hi);
  for (size_t rh = lo; rh < hi; rh++) {
    int r = (int)(rh / H), h = (int)(rh % H), kv = h / g, L = a->pos[r] + 1;
    const float *q = a->q + (size_t)r * H * hd + (size_t)h * hd;
    const float *K = a->kc + (size_t)a->seq[r] * a->max_t * w + (size_t)kv * hd;
    const float *Vv = a->vc + (size_t)a->seq[r] * a->max_t * w + (size_t)kv * hd;
    float mx = -INFINITY;
    for (int j = 0; j < L; j++) {
      float d = 0;
      for (int i = 0; i < hd; i++) d += q[i] * K[(size_t)j * w + i];
      s[j] = d;
      mx = d > mx ? d : mx;
    }
    float sum = softmax_scores(s, L, mx, scale);
    float *o = a->out + (size_t)r * H * hd + (size_t)h * hd;
    for (int i = 0; i < hd; i++) o[i] = 0;
    for (int j = 0; j < L; j++) {
      float pj = s[j] / sum;
      for (int i = 0; i < hd; i++) o[i] += pj * Vv[(size_t)j * w + i];
    }
  }
}
static void cpu_attn_cached(lt_backend_t *be, float *out, const float *q, const float *kcache,
                            const float *vcache, const int32_t *seq, const int32_t *pos, int n,
                            int H, int KV, int hd, int max_t) {
  cached_t a = {out, q, kcache, vcache, seq, pos, n, H, KV, hd, max_t, CPU(be)};
  lt_cpu_pool_run(&CPU(be)->pool, attn_cached_task, &a);
}

/* Paged cache (lt_serve): the row of position p is found through the sequence's block table;
 * the arithmetic is attn_cached's, position by position in increasing order. */
static void cpu_kv_store_paged(lt_backend_t *be, float *cache, const float *src,
                               const int32_t *slot, int n, int width) {
  for (int r = 0; r < n; r++)
    memcpy(cache + (size_t)slot[r] * width, src + (size_t)r * width,
           (size_t)width * sizeof(float));
}

typedef struct paged_args {
  float *out;
  const float *q, *kc, *vc;
  const int32_t *btab, *off, *pos;
  int n, H, KV, hd, bt;
  cpu_t *c;
} paged_t;

static void attn_paged_task(void *p, int tid, int nt) {
  paged_t *a = p;
  int H = a->H, KV = a->KV, hd = a->hd, g = H / KV, w = KV * hd, bt = a->bt;
  float scale = 1.0f / sqrtf((float)hd);
  size_t lo, hi;
  chunk((size_t)a->n * H, tid, nt, &lo, &hi);
  int maxl = 0;
  for (size_t rh = lo; rh < hi; rh++)
    maxl = a->pos[rh / H] + 1 > maxl ? a->pos[rh / H] + 1 : maxl;
  float *s = scratch(a->c, tid, (size_t)maxl + 1);
  for (size_t rh = lo; rh < hi; rh++) {
    int r = (int)(rh / H), h = (int)(rh % H), kv = h / g, L = a->pos[r] + 1;
    const int32_t *bl = a->btab + a->off[r];
    const float *q = a->q + (size_t)r * H * hd + (size_t)h * hd;
    float mx = -INFINITY;
    for (int j = 0; j < L; j++) {
      const float *K = a->kc + ((size_t)bl[j / bt] * bt + j % bt) * w + (size_t)kv * hd;
      float d = 0;
      for (int i = 0; i < hd; i++) d += q[i] * K[i];
      s[j] = d;
      mx = d > mx ? d : mx;
    }
    float sum = softmax_scores(s, L, mx, scale);
    float *o = a->out + (size_t)r * H * hd + (size_t)h * hd;
    for (int i = 0; i < hd; i++) o[i] = 0;
    for (int j = 0; j < L; j++) {
      const float *Vv = a->vc + ((size_t)bl[j / bt] * bt + j % bt) * w + (size_t)kv * hd;
      float pj = s[j] / sum;
      for (int i = 0; i < hd; i++) o[i] += pj * Vv[i];
    }
  }
}

static void cpu_attn_paged(lt_backend_t *be, float *out, const float *q, const float *kcache,
                           const float *vcache, const int32_t *btab, const int32_t *btab_off,
                           const int32_t *pos, int n, int H, int KV, int hd, int block_tokens) {
  paged_t a = {out, q, kcache, vcache, btab, btab_off, pos, n, H, KV, hd, block_tokens, CPU(be)};
  size_t work = 0; /* products of a query with keys and values: every (row, head) is its own */
  for (int r = 0; r < n; r++) work += ((size_t)pos[r] + 1) * (size_t)H * (size_t)hd * 2;
  if (work < 4 * EW_INLINE) attn_paged_task(&a, 0, 1);
  else lt_cpu_pool_run(&CPU(be)->pool, attn_paged_task, &a);
}

/* ---- SwiGLU ----------------------------------------------------------------------------- */

static void swiglu_fwd_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  lt_cpu_swiglu_fwd(e->x + lo, e->a + lo, e->b + lo, hi - lo);
}
static void cpu_swiglu_fwd(lt_backend_t *be, float *h, const float *g, const float *u,
                           size_t n) {
  ew_t e = {.x = h, .a = g, .b = u};
  ew_run_small(be, swiglu_fwd_task, &e, n, n);
}

static void swiglu_bwd_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  lt_cpu_swiglu_bwd(e->x + lo, e->y + lo, e->a + lo, e->b + lo, e->c + lo, hi - lo);
}
static void cpu_swiglu_bwd(lt_backend_t *be, float *dg, float *du, const float *dh,
                           const float *g, const float *u, size_t n) {
  ew_t e = {.x = dg, .y = du, .a = dh, .b = g, .c = u};
  ew_run(be, swiglu_bwd_task, &e, n);
}

/* ---- cross-entropy ---------------------------------------------------------------------- */

static void ce_fwd_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  int V = e->cols;
  for (size_t r = lo; r < hi; r++) {
    const float *l = e->a + r * V;
    float lse = lt_cpu_ce_lse(l, V);
    e->y[r] = lse;
    e->x[r] = l[e->ia[r]] - lse;
  }
}
static void cpu_ce_fwd(lt_backend_t *be, float *logp, float *lse, const float *logits,
                       const int32_t *targets, int N, int V) {
  ew_t e = {.x = logp, .y = lse, .a = logits, .ia = targets, .cols = V};
  ew_run(be, ce_fwd_task, &e, (size_t)N);
}

static void ce_bwd_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  int V = e->cols;
  for (size_t r = lo; r < hi; r++) {
    float *l = e->x + r * V;
    float c = e->b[r], lse = e->a[r];
    if (c == 0.0f) {
      memset(l, 0, (size_t)V * sizeof(float));
      continue;
    }
    lt_cpu_ce_grad(l, V, lse, c);
    l[e->ia[r]] += c;
  }
}
static void cpu_ce_bwd(lt_backend_t *be, float *logits, const float *lse, const int32_t *targets,
                       const float *coef, int N, int V) {
  ew_t e = {.x = logits, .a = lse, .b = coef, .ia = targets, .cols = V};
  ew_run(be, ce_bwd_task, &e, (size_t)N);
}

/* ---- AdamW ------------------------------------------------------------------------------ */

static void adamw_task(const ew_t *e, size_t lo, size_t hi, int tid) {
  float *pp = e->x, *m = e->y, *v = e->z;
  const float *g = e->a;
  float lr = e->f1, b1 = e->f2, b2 = e->f3, eps = e->f4, wd = e->f5, gs = e->f6;
  double bc1 = 1.0 - pow(b1, (double)e->l1), bc2 = 1.0 - pow(b2, (double)e->l1);
  float step_size = (float)(lr / bc1), bc2s = (float)sqrt(bc2), decay = 1.0f - lr * wd;
  for (size_t i = lo; i < hi; i++) {
    float gi = g[i] * gs;
    pp[i] *= decay;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    pp[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2s + eps);
  }
}
static void cpu_adamw(lt_backend_t *be, float *p, const float *grad, float *m, float *v,
                      size_t n, float lr, float beta1, float beta2, float eps, float wd,
                      float grad_scale, long step) {
  ew_t e = {.x = p, .y = m, .z = v, .a = grad, .f1 = lr, .f2 = beta1, .f3 = beta2,
            .f4 = eps, .f5 = wd, .f6 = grad_scale, .l1 = step};
  ew_run(be, adamw_task, &e, n);
}

/* ---- lifecycle -------------------------------------------------------------------------- */

static void cpu_destroy(lt_backend_t *be) {
  cpu_t *c = CPU(be);
  if (c->pooled) lt_cpu_pool_stop(&c->pool);
  while (c->blocks) cpu_free(be, c->blocks + 1);
  for (int t = 0; t < c->nt; t++) free(c->lanes[t].scratch);
  free(c->abf);
  free(c->attn_part);
  for (size_t i = 0; i < c->nsh; i++) free(c->sh[i].h);
  free(c->sh);
  lt_amx_destroy(c->amx);
  free(c->lanes);
  free(c);
}

lt_err_t lt_backend_cpu_new_opts(const lt_cpu_opts_t *o, lt_backend_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  int threads = o->threads;
  if (threads < 1 || threads > 256)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "cpu backend: threads = %d, expected 1..256", threads);
  cpu_t *c = calloc(1, sizeof *c);
  if (!c) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "cpu backend: out of memory");
  c->nt = threads;
  c->bf16 = o->bf16_weights;
  c->bf16_min = o->bf16_min_elems ? o->bf16_min_elems : 65536;
  c->wide = !o->narrow && __builtin_cpu_supports("avx512f");
  c->avx2 = __builtin_cpu_supports("avx2");
  c->bfdp = c->wide && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  c->lanes = calloc((size_t)threads, sizeof *c->lanes);
  lt_err_t err = c->lanes ? LT_OK : lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "cpu backend: out of memory");
  if (err || (o->amx_bf16 && (err = lt_amx_new(c->bf16_min, &c->amx, errstr, errstr_size)))) {
    free(c->lanes), free(c);
    return err;
  }
  lt_backend_t *be = &c->be;
  *be = (lt_backend_t){
      .name = "cpu",
      .ctx = c,
      .destroy = cpu_destroy,
      .last_error = cpu_last_error,
      .alloc = cpu_alloc,
      .free = cpu_free,
      .upload = cpu_upload,
      .download = cpu_download,
      .map_const = cpu_map_const,
      .free_const = cpu_free_const,
      .grad_f32 = cpu_grad_f32,
      .scrub = cpu_scrub,
      .matmul = cpu_matmul,
      .matmul_rows = cpu_matmul_rows,
      .matmul_rows_multi = cpu_matmul_rows_multi,
      .matmul_strided = cpu_matmul_strided,
      .zero = cpu_zero,
      .copy = cpu_copy,
      .scale = cpu_scale,
      .axpy = cpu_axpy,
      .sumsq = cpu_sumsq,
      .bias_add = cpu_bias_add,
      .bias_bwd = cpu_bias_bwd,
      .dropout = cpu_dropout,
      .embed_fwd = cpu_embed_fwd,
      .embed_bwd = cpu_embed_bwd,
      .rmsnorm_fwd = cpu_rmsnorm_fwd,
      .rmsnorm_bwd = cpu_rmsnorm_bwd,
      .rope = cpu_rope,
      .attn_state_floats = cpu_attn_state_floats,
      .attn_fwd = cpu_attn_fwd,
      .attn_bwd = cpu_attn_bwd,
      .kv_store = cpu_kv_store,
      .attn_cached = cpu_attn_cached,
      .kv_store_paged = cpu_kv_store_paged,
      .attn_paged = cpu_attn_paged,
      .swiglu_fwd = cpu_swiglu_fwd,
      .swiglu_bwd = cpu_swiglu_bwd,
      .ce_fwd = cpu_ce_fwd,
      .ce_bwd = cpu_ce_bwd,
      .adamw = cpu_adamw,
  };
  /* ours is the only pool: OpenBLAS runs single-threaded inside each of our threads */
  openblas_set_num_threads(1);
  int bad = lt_cpu_pool_start(&c->pool, threads);
  c->pooled = !bad;
  if (bad) {
    cpu_destroy(be);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "cpu backend: cannot start thread %d", bad);
  }
  *out = be;
  return LT_OK;
}
