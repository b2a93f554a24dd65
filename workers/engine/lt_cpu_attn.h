/* lt_cpu_attn: the cpu backend's causal attention for training (attn_fwd / attn_bwd of
 * lt_backend.h), flash-attention style, internal to the cpu backend and its tests.
 *
 * lt_backend_cpu.c runs one call per task on its thread pool: the forward pass per (sequence,
 * kv head, range of query tiles), the backward pass likewise; with
 * many rows a range is all of a row's tiles, with a few long ones (1 x 2048) each row is cut
 * into ranges of equal work (lt_cpu_attn_split), the backward pass giving each range after the
 * first a dk and dv of its own that the backend adds up in range order. Each call walks query tiles x key
 * tiles of LT_CPU_ATTN_TILE rows, skips every key tile above the diagonal or before the first
 * example start of the query tile (packed rows), and never holds more than a tile of scores:
 * the forward pass keeps a running max and sum per row (online softmax) and saves only the
 * row's max m and 1/sum, the backward pass recomputes the probabilities from them. Memory is
 * 2*B*H*T floats of state plus lt_cpu_attn_scratch() floats per thread (linear in T), and in
 * the backward pass the ranges' dk and dv: fewer than 16 * 2 * T * hd floats (16.8 MB at
 * T = 2048, hd 64), as ranges are cut only until there are 16 tasks.
 *
 * Why m and 1/sum rather than the log-sum-exp alone (half the state): P = exp(s - lse) adds
 * lse's rounding (an ulp of log T + max, several times an ulp of s) to every recomputed
 * probability, and the engine's PyTorch parity (two AdamW steps, 1e-4) went from 4.5e-5 to
 * 1.05e-4. exp((s - m) / sqrt(hd)) * (1/sum) is bitwise the forward's probability for a row
 * whose window fits one key tile, and as accurate as the full-square kernels otherwise (s
 * unscaled until s - m is taken, as they did: scaling first cost 1.7e-4 on the same test).
 *
 * The old full-square kernels (T x T probabilities as the state) stay here as
 * lt_cpu_attn_ref_*: the tests hold the tiled kernels to them. */
#ifndef LT_CPU_ATTN_H
#define LT_CPU_ATTN_H

#include <stddef.h>
#include <stdint.h>

/* Rows of a query tile and of a key tile (bench: 64 beats 32 and 128 at hd 64). */
#define LT_CPU_ATTN_TILE 64

/* The shapes of one attn_fwd / attn_bwd call (lt_backend.h's names). */
typedef struct lt_cpu_attn_dims {
  int B, T, H, KV, hd;
} lt_cpu_attn_dims_t;

/* Floats of per-thread scratch lt_cpu_attn_fwd_kv and lt_cpu_attn_bwd_kv need with tiles of
 * `tile` rows, g query heads per kv head and rows of T: g * (2 * tile * tile + 3 * tile * hd +
 * 3 * tile) for the tiles, and 2 * hd * T for the keys and values a call reads, transposed
 * (1 MB at T = 2048, hd 64). */
size_t lt_cpu_attn_scratch(int tile, int hd, int g, int T);

/* A few long rows make few (sequence, kv head) tasks: 1 x 2048 with 3 kv heads was 3 backward
 * tasks for 2 threads, one idle a third of the time. lt_cpu_attn_parts says into how many
 * ranges of query tiles to cut each, so that there are at least LT_CPU_ATTN_UNITS tasks (at most
 * LT_CPU_ATTN_MAX_PARTS ranges, no more than the tiles): a count of the shapes alone, never of
 * the thread count, so neither are the results. */
#define LT_CPU_ATTN_UNITS 16
#define LT_CPU_ATTN_MAX_PARTS 16
int lt_cpu_attn_parts(int B, int heads, int T, int tile);

/* Task u of B * KV * parts: its sequence b, kv head, range number and query tiles [qt0, qt1). */
void lt_cpu_attn_unit(lt_cpu_attn_dims_t d, int tile, const int32_t *pos, int parts, size_t u, int *b, int *kv,
                      int *qt0, int *qt1, int *part);

/* Cuts the query tiles of one sequence (ps: its positions) into `parts` ranges of about equal
 * work (key tiles visited): range p is tiles [bounds[p], bounds[p+1]); bounds has parts + 1
 * entries, some ranges may be empty. Depends on nothing but T, tile, ps and parts, so the
 * backend can run the ranges as tasks and keep its results independent of its thread count. */
void lt_cpu_attn_split(int T, int tile, const int32_t *ps, int parts, int *bounds);

/* Forward pass of the query heads kv*g .. kv*g + g-1 (g = H/KV) of sequence b over query tiles
 * [qt0, qt1): those rows of out (N, H*hd) and of the state (2*B*H*T floats; row
 * r = (b*H + h)*T + t holds at 2r the max m of s_j = q_t k_j over the row's window and at 2r + 1
 * the inverse of sum_j exp((s_j - m) / sqrt(hd))). q, k, v, pos as attn_fwd. Writes nothing
 * else; a row's result does not depend on the range it was computed in. */
void lt_cpu_attn_fwd_kv(lt_cpu_attn_dims_t d, int tile, int b, int kv, int qt0, int qt1, float *out, float *st,
                        const float *q, const float *k, const float *v, const int32_t *pos, float *scratch);

/* Backward pass of kv head kv of sequence b over query tiles [qt0, qt1): overwrites the rows
 * of those tiles in dq for the query heads that read the kv head, and adds their part of dk
 * and dv into dk and dv (laid out as attn_bwd's: the caller zeroes them), summing over its query tiles
 * in increasing order, the g query heads of a tile in one product: the result depends on
 * nothing but the inputs, `tile` and the range. Arguments as
 * attn_bwd, st from lt_cpu_attn_fwd_head. */
void lt_cpu_attn_bwd_kv(lt_cpu_attn_dims_t d, int tile, int b, int kv, int qt0, int qt1, float *dq,
                        float *dk, float *dv, const float *dout, const float *q, const float *k,
                        const float *v, const float *out, const float *st, const int32_t *pos,
                        float *scratch);

/* The previous implementation, single-threaded, for tests: the T x T probabilities of every
 * (sequence, head) as the state (P: B*H*T*T floats), full-square products. */
void lt_cpu_attn_ref_fwd(lt_cpu_attn_dims_t d, float *out, float *P, const float *q,
                         const float *k, const float *v, const int32_t *pos);
void lt_cpu_attn_ref_bwd(lt_cpu_attn_dims_t d, float *dq, float *dk, float *dv,
                         const float *dout, const float *q, const float *k, const float *v,
                         const float *P);

#endif
