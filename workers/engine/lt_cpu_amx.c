/* The frozen base weights' products in bf16 on AMX tiles (lt_cpu_amx.h).
 *
 * Layout. A product's reduction runs over R (K of the call) and its output over Q (N). Both are
 * padded with zeros to multiples of 32, the rows of A to a multiple of 32. A weight packed for
 * one form holds, for each block of 16 output columns cb and 32 reduction steps kb, one tile of
 * 16 rows x 64 bytes: row p, column c holds the pair (r = 32 kb + 2p, 2p + 1) of output column
 * 16 cb + c, as TDPBF16PS reads its second source. The kernel computes blocks of 32 x 32 outputs
 * in four accumulator tiles, over kb in order. */
#include "lt_cpu_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lt_safetensors.h" /* lt_st_f32_to_bf16 */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_ELEMS 512 /* bf16 in one 16 x 64-byte tile */

typedef struct {
  const float *w;
  size_t n;
  /* packed for A W^T (nt) and for A W (nn), with the Q x R they were packed for */
  uint16_t *pk[2];
  int q[2], r[2];
  bool grad_f32; /* lt_amx_grad_f32: the A W form stays f32 */
} weight_t;

struct lt_amx {
  size_t min_elems;
  weight_t *w;
  size_t nw, capw;
  uint16_t *abf; /* A rounded to bf16, Mp x Rp; grows */
  size_t abf_n;
  float *ct; /* the padded product, Mp x Qp; grows */
  size_t ct_n;
};

typedef struct {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) tilecfg_t;

static int round32(int v) { return (v + 31) / 32 * 32; }

/* AMX-TILE, AMX-BF16 (CPUID leaf 7: EDX bits 24, 22) and AVX-512 BF16 (leaf 7.1: EAX bit 5), asked
 * of the chip itself: clang 14's __builtin_cpu_supports does not know the AMX names. */
static bool chip_has_amx(void) {
  unsigned a, b, c, d, a1, b1, c1, d1;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) return false;
  return (d >> 24 & 1) && (d >> 22 & 1) && (a1 >> 5 & 1);
}

static int perm_rc = -1; /* arch_prctl's answer, asked once per process */
static void ask_perm(void) { perm_rc = (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

lt_err_t lt_amx_new(size_t min_elems, lt_amx_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  if (!chip_has_amx())
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "bf16 base weights need a cpu with AMX-BF16 and AVX-512 BF16 (this one has not)");
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, ask_perm);
  if (perm_rc != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "bf16 base weights: the kernel refused this process the AMX tile state (arch_prctl)");
  lt_amx_t *x = calloc(1, sizeof *x);
  if (!x) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  x->min_elems = min_elems;
  *out = x;
  return LT_OK;
}

void lt_amx_destroy(lt_amx_t *x) {
  if (!x) return;
  for (size_t i = 0; i < x->nw; i++) free(x->w[i].pk[0]), free(x->w[i].pk[1]);
  free(x->w);
  free(x->abf);
  free(x->ct);
  free(x);
}

lt_err_t lt_amx_add(lt_amx_t *x, const float *w, size_t n) {
  if (n < x->min_elems) return LT_OK;
  for (size_t i = 0; i < x->nw; i++)
    if (x->w[i].w == w) return LT_OK;
  if (x->nw == x->capw) {
    size_t cap = x->capw ? 2 * x->capw : 64;
    weight_t *nw = realloc(x->w, cap * sizeof *nw);
    if (!nw) return LT_ERR_NOMEM;
    x->w = nw;
    x->capw = cap;
  }
  x->w[x->nw++] = (weight_t){.w = w, .n = n};
  return LT_OK;
}

void lt_amx_grad_f32(lt_amx_t *x, const float *w) {
  for (size_t i = 0; x && i < x->nw; i++)
    if (x->w[i].w == w) x->w[i].grad_f32 = true;
}
void lt_amx_remove(lt_amx_t *x, const float *w) {
  for (size_t i = 0; x && i < x->nw; i++)
    if (x->w[i].w == w) {
      free(x->w[i].pk[0]), free(x->w[i].pk[1]);
      x->w[i] = x->w[--x->nw];
      return;
    }
}

/* Packs W for one form: nt, W is Q x R (B(r, c) = W[c][r]); else R x Q (B(r, c) = W[r][c]). */
static uint16_t *pack(const float *W, int nt, int Q, int R) {
  int Qp = round32(Q), Rp = round32(R), KB = Rp / 32;
  uint16_t *pk = calloc((size_t)Qp * Rp, sizeof *pk);
  if (!pk) return NULL;
  for (int cb = 0; cb < Qp / 16; cb++)
    for (int kb = 0; kb < KB; kb++) {
      uint16_t *t = pk + ((size_t)cb * KB + kb) * TILE_ELEMS;
      for (int p = 0; p < 16; p++)
        for (int c = 0; c < 16; c++)
          for (int h = 0; h < 2; h++) {
            int r = kb * 32 + 2 * p + h, q = cb * 16 + c;
            if (r < R && q < Q)
              t[p * 32 + c * 2 + h] = lt_st_f32_to_bf16(nt ? W[(size_t)q * R + r] : W[(size_t)r * Q + q]);
          }
    }
  return pk;
}

typedef struct {
  lt_amx_t *x;
  const uint16_t *pk;
  const float *A;
  float *C;
  int M, Q, R, Mp, Qp, Rp, lda, ldc;
  float alpha, beta;
} job_t;

/* Rows of A rounded to bf16 (nearest even), zero-padded to Rp columns and Mp rows; the threads
 * take rows in turn. */
__attribute__((target("avx512f,avx512bf16"))) static void round_rows(void *arg, int tid, int nt) {
  job_t *j = arg;
  for (int m = tid; m < j->Mp; m += nt) {
    uint16_t *d = j->x->abf + (size_t)m * j->Rp;
    if (m >= j->M) {
      memset(d, 0, (size_t)j->Rp * sizeof *d);
      continue;
    }
    const float *a = j->A + (size_t)m * j->lda;
    int k = 0;
    for (; k + 32 <= j->R; k += 32) {
      __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + k + 16), _mm512_loadu_ps(a + k));
      _mm512_storeu_si512(d + k, (__m512i)v);
    }
    for (; k < j->R; k++) d[k] = lt_st_f32_to_bf16(a[k]);
    for (; k < j->Rp; k++) d[k] = 0;
  }
}

/* The thread's share of 32-column blocks: the products into ct, then alpha, beta into C. */
__attribute__((target("amx-tile,amx-bf16"))) static void tiles(void *arg, int tid, int nt) {
  job_t *j = arg;
  int blocks = j->Qp / 32, b0 = blocks * tid / nt, b1 = blocks * (tid + 1) / nt, KB = j->Rp / 32;
  if (b0 == b1) return;
  tilecfg_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) {
    cfg.rows[i] = 16;
    cfg.colsb[i] = 64;
  }
  _tile_loadconfig(&cfg);
  const uint16_t *abf = j->x->abf;
  float *ct = j->x->ct;
  size_t sa = (size_t)j->Rp * 2, sc = (size_t)j->Qp * 4;
  for (int m = 0; m < j->Mp; m += 32)
    for (int b = b0; b < b1; b++) {
      const uint16_t *p0 = j->pk + (size_t)(2 * b) * KB * TILE_ELEMS, *p1 = p0 + (size_t)KB * TILE_ELEMS;
      const uint16_t *a0 = abf + (size_t)m * j->Rp, *a1 = a0 + (size_t)16 * j->Rp;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int kb = 0; kb < KB; kb++) {
        _tile_loadd(4, a0 + kb * 32, sa);
        _tile_loadd(5, a1 + kb * 32, sa);
        _tile_loadd(6, p0 + (size_t)kb * TILE_ELEMS, 64);
        _tile_loadd(7, p1 + (size_t)kb * TILE_ELEMS, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      float *c = ct + (size_t)m * j->Qp + 32 * b;
      _tile_stored(0, c, sc);
      _tile_stored(1, c + 16, sc);
      _tile_stored(2, c + (size_t)16 * j->Qp, sc);
      _tile_stored(3, c + (size_t)16 * j->Qp + 16, sc);
    }
  _tile_release();
  int q0 = 32 * b0, q1 = 32 * b1 < j->Q ? 32 * b1 : j->Q;
  for (int m = 0; m < j->M; m++) {
    const float *src = ct + (size_t)m * j->Qp;
    float *dst = j->C + (size_t)m * j->ldc;
    if (j->beta == 0)
      for (int q = q0; q < q1; q++) dst[q] = j->alpha * src[q];
    else
      for (int q = q0; q < q1; q++) dst[q] = j->alpha * src[q] + j->beta * dst[q];
  }
}

bool lt_amx_matmul(lt_amx_t *x, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *W, int ldb, float beta, float *C, int ldc, lt_amx_run_fn run, void *pool) {
  weight_t *e = NULL;
  for (size_t i = 0; i < x->nw && !e; i++)
    if (x->w[i].w == W) e = &x->w[i];
  if (!e || (e->grad_f32 && !tb) || (size_t)N * K != e->n || ldb != (tb ? K : N) || M <= 0) return false;
  int f = tb ? 0 : 1;
  if (e->pk[f] && (e->q[f] != N || e->r[f] != K)) return false; /* packed for another shape */
  if (!e->pk[f]) {
    if (!(e->pk[f] = pack(W, tb, N, K))) return false;
    e->q[f] = N;
    e->r[f] = K;
  }
  job_t j = {.x = x, .pk = e->pk[f], .A = A, .C = C, .M = M, .Q = N, .R = K, .Mp = round32(M), .Qp = round32(N),
             .Rp = round32(K), .lda = lda, .ldc = ldc, .alpha = alpha, .beta = beta};
  size_t na = (size_t)j.Mp * j.Rp, nc = (size_t)j.Mp * j.Qp;
  if (na > x->abf_n) {
    uint16_t *p = realloc(x->abf, na * sizeof *p);
    if (!p) return false;
    x->abf = p;
    x->abf_n = na;
  }
  if (nc > x->ct_n) {
    float *p = realloc(x->ct, nc * sizeof *p);
    if (!p) return false;
    x->ct = p;
    x->ct_n = nc;
  }
  run(pool, round_rows, &j);
  run(pool, tiles, &j);
  return true;
}
