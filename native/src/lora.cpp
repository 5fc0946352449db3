// LoRA over a mixed batch (plugins/src/plugins/lora.py has the contract and the torch
// reference): rows map to adapter slots (-1: a base row, untouched), and the delta of row t
// in slot s is B[s] @ (A[s] @ x[t]), in two products: shrink h[t] = A[s] @ x[t], expand
// y[t, offset + n] += B[s][n] . h[t], both summed in float32, y rounded once into its dtype.
//
// The adapter rows are grouped by slot and cut into tiles of up to kTileRows rows of one slot;
// a tile is one task of the pool. lora_apply (the fused decoder's call, one per adapted
// linear) shrinks a tile's rows into the task's own scratch and expands every part of the
// linear's output from it: one dispatch per linear, no barrier between the products, and no
// dispatch at all when the work is small (batch-1 decode), where waking the pool costs more
// than the deltas. Vector builds (CK_V8) with in and the rank multiples of 8 take register
// tiles: the shrink 2 rows x 4 rows of A, the expand 2 rows x 8 outputs, each output's dot
// over the rank (B is [N, R]: a row of B is one output's) reduced 8 at a time by
// v8_hsum8x8; other shapes and the scalar build take plain loops. A slot with kTransposeRows
// rows or more (prefill) has its B transposed once per call instead, each row's update then
// an axpy over the outputs per rank, vectorized over outputs (the dots cost a reduction each).
#include <stdlib.h>

#include <type_traits>

#include "kernels.h"
#include "simd.h"

namespace CK_NS {

// rows of one slot in a tile (one task: its shrink's h is kTileRows x r_total floats)
static const long kTileRows = 4;
// outputs of a transposed B's block (the expand's float32 sums of a row: kOutBlock floats)
static const long kOutBlock = 64;
// the largest rank the kernels take (core's max_lora_rank tops out at 256)
static const long kMaxRank = 256;
// the most parts of one linear's output (q, k, v): a tile's h fits the task's stack
static const long kMaxParts = 3;
// the least work (multiply-adds) worth spreading over the pool
static const long kParallelWork = 1L << 17;
// a slot's rows from which the expand reads its B transposed once per call ([rank, n]: each
// row's update a contiguous axpy over outputs per rank) rather than as n rank-long dots
static const long kTransposeRows = 16;
// the row groups' scratch (longs) kept on the stack; more rows or slots allocate
static const long kStackLongs = 2048;

// The adapter rows grouped by slot and cut into tiles: order holds the rows, slot by slot
// (a counting sort of row_slots), tile i is order[tiles[i] .. tiles[i + 1]), all its rows
// of slot slot_of[i]. buf holds 2 * num_slots + 1 + 3 * rows + 1 longs.
struct Tiles {
  long *first, *order, *tiles, *slot_of;  // first: slot s's rows are order[first[s] .. first[s + 1])
  long num_tiles, num_rows;  // num_rows: the adapter rows
};

static long tiles_longs(long rows, long num_slots) { return 2 * num_slots + 1 + 3 * rows + 1; }

static Tiles make_tiles(const int64_t *row_slots, long rows, long num_slots, long *buf) {
  long *first = buf, *next = first + num_slots + 1;
  Tiles t = {first, next + num_slots, next + num_slots + rows, next + num_slots + 2 * rows + 1, 0, 0};
  for (long s = 0; s <= num_slots; ++s) first[s] = 0;
  for (long r = 0; r < rows; ++r)
    if (row_slots[r] >= 0) ++first[row_slots[r] + 1];
  for (long s = 0; s < num_slots; ++s) first[s + 1] += first[s];
  for (long s = 0; s < num_slots; ++s) next[s] = first[s];
  for (long r = 0; r < rows; ++r)
    if (row_slots[r] >= 0) t.order[next[row_slots[r]]++] = r;
  for (long s = 0; s < num_slots; ++s)
    for (long g = first[s]; g < first[s + 1]; g += kTileRows) {
      t.slot_of[t.num_tiles] = s;
      t.tiles[t.num_tiles++] = g;
    }
  t.num_rows = first[num_slots];
  t.tiles[t.num_tiles] = t.num_rows;
  return t;
}

// h[h_rows[i] * h_stride + r] = A[r] . x[rows[i]] for the tile's count rows (a: the slot's
// [r_total, k] A; x rows at x + row * x_stride)
template <typename T>
static void shrink_tile(const T *x, long x_stride, const long *rows, long count, const T *a, long r_total, long k,
                        float *h, long h_stride, const long *h_rows) {
#if defined(CK_V8)
  if (k % 8 == 0 && r_total % 8 == 0) {
    long i = 0;
    for (; i + 2 <= count; i += 2) {  // 2 rows x 4 rows of A: 8 accumulators, 6 loads per 8 FMAs
      const T *x0 = x + rows[i] * x_stride, *x1 = x + rows[i + 1] * x_stride;
      float *h0 = h + h_rows[i] * h_stride, *h1 = h + h_rows[i + 1] * h_stride;
      for (long r = 0; r < r_total; r += 4) {
        v8 acc[8];
        for (int q = 0; q < 8; ++q) acc[q] = v8_zero();
        const T *ar = a + r * k;
        for (long c = 0; c < k; c += 8) {
          v8 xv0 = v8_load(x0 + c), xv1 = v8_load(x1 + c);
          v8_keep(xv0);
          v8_keep(xv1);
          for (int q = 0; q < 4; ++q) {
            const v8 av = v8_load(ar + q * k + c);
            acc[q] = v8_fma(av, xv0, acc[q]);
            acc[4 + q] = v8_fma(av, xv1, acc[4 + q]);
          }
        }
        float sums[8];
        v8_hsum8x8(acc, sums);
        for (int q = 0; q < 4; ++q) h0[r + q] = sums[q], h1[r + q] = sums[4 + q];
      }
    }
    if (i < count) {  // the last odd row: 8 rows of A at a time, 8 accumulators
      const T *x0 = x + rows[i] * x_stride;
      float *h0 = h + h_rows[i] * h_stride;
      for (long r = 0; r < r_total; r += 8) {
        v8 acc[8];
        for (int q = 0; q < 8; ++q) acc[q] = v8_zero();
        const T *ar = a + r * k;
        for (long c = 0; c < k; c += 8) {
          v8 xv = v8_load(x0 + c);
          v8_keep(xv);
          for (int q = 0; q < 8; ++q) acc[q] = v8_fma(v8_load(ar + q * k + c), xv, acc[q]);
        }
        v8_hsum8x8(acc, h0 + r);
      }
    }
    return;
  }
#endif
  for (long i = 0; i < count; ++i) {
    const T *xr = x + rows[i] * x_stride;
    float *hr = h + h_rows[i] * h_stride;
    for (long r = 0; r < r_total; ++r) {
      const T *ar = a + r * k;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (long c = 0; c < k; ++c) acc += to_f32(ar[c]) * to_f32(xr[c]);
      hr[r] = acc;
    }
  }
}

#if defined(CK_V8)
// outputs j0 .. j0 + 8 of P rows (rank a multiple of 8): 8 * P accumulators, B's rows loaded
// once for the P rows; each output's dot reduced by v8_hsum8x8
template <int P, typename T>
static inline void expand_8(T *const *yt, const float *const *ht, const T *b, long j0, long rank) {
  v8 acc[8 * P];
  for (int q = 0; q < 8 * P; ++q) acc[q] = v8_zero();
  for (long c = 0; c < rank; c += 8) {
    v8 hv[P];
    for (int p = 0; p < P; ++p) {
      hv[p] = v8_load(ht[p] + c);
      v8_keep(hv[p]);
    }
    for (int q = 0; q < 8; ++q) {
      const v8 bv = v8_load(b + (j0 + q) * rank + c);
      for (int p = 0; p < P; ++p) acc[8 * p + q] = v8_fma(bv, hv[p], acc[8 * p + q]);
    }
  }
  for (int p = 0; p < P; ++p) {
    float sums[8];
    v8_hsum8x8(acc + 8 * p, sums);
    if constexpr (std::is_same<T, float>::value)
      v8_store(yt[p] + j0, v8_add(v8_load(yt[p] + j0), v8_load(sums)));
    else
      for (int q = 0; q < 8; ++q) from_f32(to_f32(yt[p][j0 + q]) + sums[q], &yt[p][j0 + q]);
  }
}
#endif

// y[j] += sum over r < rank of h[r] * bt[r * n + j] for j < NB (a fixed count: the sums stay in registers)
template <long NB, typename T>
static inline void axpy_block(T *y, const float *h, const float *bt, long n, long rank) {
  float acc[NB];
#pragma omp simd
  for (long j = 0; j < NB; ++j) acc[j] = 0.0f;
  for (long r = 0; r < rank; ++r) {
    const float hr = h[r], *row = bt + r * n;
#pragma omp simd
    for (long j = 0; j < NB; ++j) acc[j] += hr * row[j];
  }
#pragma omp simd
  for (long j = 0; j < NB; ++j) from_f32(to_f32(y[j]) + acc[j], &y[j]);
}

// y[rows[i] * y_stride + j] += B[j] . h[h_rows[i] * h_stride ..] for j < n (b: the slot's
// [n, rank] B of this part, bt the same transposed to [rank, n] float32 or NULL; y points at the
// part's first column)
template <typename T>
static void expand_tile(T *y, long y_stride, const long *rows, long count, const float *h, long h_stride,
                        const long *h_rows, const T *b, const float *bt, long n, long rank) {
  T *yt[kTileRows];
  const float *ht[kTileRows];
  for (long i = 0; i < count; ++i) yt[i] = y + rows[i] * y_stride, ht[i] = h + h_rows[i] * h_stride;
  if (bt) {  // B^T: per block of outputs, each row's sums over the rank vectorized over outputs
    long j0 = 0;
    for (; j0 + kOutBlock <= n; j0 += kOutBlock)
      for (long i = 0; i < count; ++i) axpy_block<kOutBlock>(yt[i] + j0, ht[i], bt + j0, n, rank);
    for (; j0 < n; j0 += 8) {  // the last outputs, 8 or fewer at a time
      const long nb = n - j0 < 8 ? n - j0 : 8;
      for (long i = 0; i < count; ++i) {
        float acc[8] = {0.0f};
        for (long r = 0; r < rank; ++r)
          for (long j = 0; j < nb; ++j) acc[j] += ht[i][r] * bt[r * n + j0 + j];
        for (long j = 0; j < nb; ++j) from_f32(to_f32(yt[i][j0 + j]) + acc[j], &yt[i][j0 + j]);
      }
    }
    return;
  }
  long j0 = 0;
#if defined(CK_V8)
  if (rank % 8 == 0)
    for (; j0 + 8 <= n; j0 += 8) {  // 2 rows at a time (16 accumulators), then the odd one
      long i = 0;
      for (; i + 2 <= count; i += 2) expand_8<2>(yt + i, ht + i, b, j0, rank);
      if (i < count) expand_8<1>(yt + i, ht + i, b, j0, rank);
    }
#endif
  for (long i = 0; i < count; ++i)  // outputs the register tiles did not take: rank-long dots
    for (long j = j0; j < n; ++j) {
      const T *bj = b + j * rank;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (long r = 0; r < rank; ++r) sum += to_f32(bj[r]) * ht[i][r];
      from_f32(to_f32(yt[i][j]) + sum, &yt[i][j]);
    }
}

// The tiles of rows' groups, on the stack when they fit; Tiles.tiles is NULL when the
// allocation failed.
struct Grouped {
  long stack[kStackLongs];
  long *heap;
  Tiles t;
  Grouped(const int64_t *row_slots, long rows, long num_slots) : heap(NULL) {
    const long need = tiles_longs(rows, num_slots);
    long *buf = need <= kStackLongs ? stack : (heap = (long *)malloc(sizeof(long) * need));
    if (buf)
      t = make_tiles(row_slots, rows, num_slots, buf);
    else
      t.tiles = NULL;
  }
  ~Grouped() { free(heap); }
};

// B^T ([rank, n[p]] float32) of each part p of each slot with at least kTransposeRows rows:
// bt[s * num_parts + p], NULL for the other slots (their rows take dots). ok is false when the
// buffers could not be had.
struct TransposedB {
  float **bt;
  bool ok;
  template <typename T>
  TransposedB(const Tiles &t, long num_slots, const T *const *b, const long *n, long num_parts, long rank)
      : bt(NULL), ok(true) {
    long floats = 0;
    for (long s = 0; s < num_slots; ++s)
      if (t.first[s + 1] - t.first[s] >= kTransposeRows)
        for (long p = 0; p < num_parts; ++p) floats += n[p] * rank;
    if (!floats) return;
    const long ptrs = num_slots * num_parts;
    bt = (float **)malloc(sizeof(float *) * ptrs + sizeof(float) * floats);
    if (!bt) {
      ok = false;
      return;
    }
    float *next = (float *)(bt + ptrs);
    for (long s = 0; s < num_slots; ++s)
      for (long p = 0; p < num_parts; ++p) {
        float *dst = NULL;
        if (t.first[s + 1] - t.first[s] >= kTransposeRows) {
          const T *src = b[p] + s * n[p] * rank;
          dst = next;
          next += n[p] * rank;
          for (long j = 0; j < n[p]; ++j)
            for (long r = 0; r < rank; ++r) dst[r * n[p] + j] = to_f32(src[j * rank + r]);
        }
        bt[s * num_parts + p] = dst;
      }
  }
  const float *of(long s, long p, long num_parts) const { return bt ? bt[s * num_parts + p] : NULL; }
  ~TransposedB() { free(bt); }
};

// the tile-local h rows of a fused call: row i of a tile is h row i
static const long kTileIndex[kTileRows] = {0, 1, 2, 3};

template <typename T>
static int apply_rows(const T *x, long x_stride, T *y, long y_stride, const T *a, long k, const T *const *b,
                       const long *n, long num_parts, long rank, long num_slots, const Tiles &t, int nthreads) {
  const TransposedB bts(t, num_slots, b, n, num_parts, rank);
  if (!bts.ok) return -2;
  const long r_total = num_parts * rank;
  long out = 0;
  for (long p = 0; p < num_parts; ++p) out += n[p];
  const bool parallel = t.num_rows * (r_total * k + out * rank) >= kParallelWork;
  parallel_for(t.num_tiles, 1, nthreads, parallel, [&](long lo, long hi) {
    float h[kTileRows * kMaxParts * kMaxRank];
    for (long i = lo; i < hi; ++i) {
      const long s = t.slot_of[i], *rows = t.order + t.tiles[i], count = t.tiles[i + 1] - t.tiles[i];
      shrink_tile(x, x_stride, rows, count, a + s * r_total * k, r_total, k, h, r_total, kTileIndex);
      for (long p = 0, offset = 0; p < num_parts; offset += n[p++])
        expand_tile(y + offset, y_stride, rows, count, h + p * rank, r_total, kTileIndex, b[p] + s * n[p] * rank,
                    bts.of(s, p, num_parts), n[p], rank);
    }
  });
  return 0;
}

template <typename T>
static int expand_rows(T *y, long y_stride, const float *h, long h_stride, const T *b, long n, long rank,
                       long num_slots, const Tiles &t, int nthreads) {
  const TransposedB bts(t, num_slots, &b, &n, 1, rank);
  if (!bts.ok) return -2;
  parallel_for(t.num_tiles, 1, nthreads, t.num_rows * n * rank >= kParallelWork, [&](long lo, long hi) {
    for (long i = lo; i < hi; ++i) {
      const long s = t.slot_of[i], *rows = t.order + t.tiles[i], count = t.tiles[i + 1] - t.tiles[i];
      expand_tile(y, y_stride, rows, count, h, h_stride, rows, b + s * n * rank, bts.of(s, 0, 1), n, rank);
    }
  });
  return 0;
}

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// the largest rank the LoRA kernels take
long CK_FN(lora_max_rank)(void) { return kMaxRank; }

// h [rows, r_total] (float32, row stride r_total) = A[slot(t)] @ x[t] for each row t with
// row_slots[t] >= 0, 0 elsewhere; a [num_slots, r_total, in] and x (row stride x_stride) in
// dtype (CK_F32 / CK_BF16). Returns -1 for another dtype, -2 when the rows' groups could not
// be allocated.
int CK_FN(lora_shrink)(int dtype, const void *x, long x_stride, long rows, const void *a, long r_total, long in,
                       const int64_t *row_slots, float *h, int nthreads) {
  if (dtype != CK_F32 && dtype != CK_BF16) return -1;
  long num_slots = 0;  // the slots' count as far as the rows use them
  for (long r = 0; r < rows; ++r) num_slots = row_slots[r] >= num_slots ? row_slots[r] + 1 : num_slots;
  Grouped g(row_slots, rows, num_slots);
  if (!g.t.tiles) return -2;
  const Tiles &t = g.t;
  for (long r = 0; r < rows; ++r)
    if (row_slots[r] < 0) memset(h + r * r_total, 0, sizeof(float) * r_total);
  const bool parallel = t.num_rows * r_total * in >= kParallelWork;
  parallel_for(t.num_tiles, 1, nthreads, parallel, [&](long lo, long hi) {
    for (long i = lo; i < hi; ++i) {
      const long s = t.slot_of[i], *tr = t.order + t.tiles[i], count = t.tiles[i + 1] - t.tiles[i];
      if (dtype == CK_F32)
        shrink_tile((const float *)x, x_stride, tr, count, (const float *)a + s * r_total * in, r_total, in, h,
                    r_total, tr);
      else
        shrink_tile((const bf16_t *)x, x_stride, tr, count, (const bf16_t *)a + s * r_total * in, r_total, in, h,
                    r_total, tr);
    }
  });
  return 0;
}

// y[t, 0 .. n) += B[slot(t)] @ h[t, 0 .. rank) for each row t with row_slots[t] >= 0 (y points
// at the part's first column, row stride y_stride; h float32, row stride h_stride; b
// [num_slots, n, rank]; y and b in dtype). Returns -1 for another dtype or a rank above 256,
// -2 when the rows' groups could not be allocated.
int CK_FN(lora_expand)(int dtype, void *y, long y_stride, const float *h, long h_stride, const void *b, long n,
                       long rank, const int64_t *row_slots, long rows, long num_slots, int nthreads) {
  if ((dtype != CK_F32 && dtype != CK_BF16) || rank > kMaxRank) return -1;
  Grouped g(row_slots, rows, num_slots);
  if (!g.t.tiles) return -2;
  const Tiles &t = g.t;
  if (dtype == CK_F32) return expand_rows((float *)y, y_stride, h, h_stride, (const float *)b, n, rank, num_slots, t,
                                          nthreads);
  return expand_rows((bf16_t *)y, y_stride, h, h_stride, (const bf16_t *)b, n, rank, num_slots, t, nthreads);
}

// A linear's adapter deltas in one call: y[t, offset_p .. offset_p + n[p]) += B_p[slot(t)] @
// (A[slot(t)] @ x[t])[p * rank .. (p + 1) * rank) for each part p < num_parts (<= 3, offsets the
// parts' sizes summed in order) and each row t with row_slots[t] >= 0. x [rows, k] (row stride
// x_stride), y (row stride y_stride), a [num_slots, num_parts * rank, k] and each b[p]
// [num_slots, n[p], rank] in dtype. Returns -1 for another dtype, more than 3 parts or a rank
// above 256, -2 when the rows' groups could not be allocated.
int CK_FN(lora_apply)(int dtype, const void *x, long x_stride, long rows, void *y, long y_stride, const void *a,
                      long k, const void *const *b, const long *n, long num_parts, long rank,
                      const int64_t *row_slots, long num_slots, int nthreads) {
  if ((dtype != CK_F32 && dtype != CK_BF16) || num_parts > kMaxParts || rank > kMaxRank) return -1;
  Grouped g(row_slots, rows, num_slots);
  if (!g.t.tiles) return -2;
  if (dtype == CK_F32)
    return apply_rows((const float *)x, x_stride, (float *)y, y_stride, (const float *)a, k, (const float *const *)b,
                      n, num_parts, rank, num_slots, g.t, nthreads);
  return apply_rows((const bf16_t *)x, x_stride, (bf16_t *)y, y_stride, (const bf16_t *)a, k,
                    (const bf16_t *const *)b, n, num_parts, rank, num_slots, g.t, nthreads);
}

}  // extern "C"
