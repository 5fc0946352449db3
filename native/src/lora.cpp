// LoRA over a mixed batch (plugins/src/plugins/lora.py has the contract and the torch
// reference): rows map to adapter slots (-1: a base row, untouched), and the delta of row t
// in slot s is B[s] @ (A[s] @ x[t]), in two products. shrink: h[t] = A[s] @ x[t], float32
// sums, contiguous dots over the input features. expand: y[t, offset + n] += B[s][n] . h[t],
// summed in float32 and rounded once into y's dtype. B[s] is [N, R] (R the stack's rank): a
// slot's rows are taken together per block of outputs, B's block transposed once into a
// thread's scratch so every row's update is a contiguous axpy over outputs; a slot with one
// row (batch-1 decode) takes R-long dots instead, which costs no transpose.
#include <stdlib.h>

#include "kernels.h"

namespace CK_NS {

// outputs of B a thread takes at a time (its transposed block: kOutBlock x R floats)
static const long kOutBlock = 64;
// the largest rank the expand's scratch holds (core's max_lora_rank tops out at 256)
static const long kMaxRank = 256;

// rows of each slot, slot by slot: order[first[s] .. first[s + 1]) are slot s's rows, in
// order (a counting sort of row_slots over [0, num_slots)); returns the adapter rows' count
static long group_rows(const int64_t *row_slots, long rows, long num_slots, long *first, long *order) {
  for (long s = 0; s <= num_slots; ++s) first[s] = 0;
  for (long t = 0; t < rows; ++t)
    if (row_slots[t] >= 0) ++first[row_slots[t] + 1];
  for (long s = 0; s < num_slots; ++s) first[s + 1] += first[s];
  long *next = first + num_slots + 1;  // scratch: the next free place of each slot
  for (long s = 0; s < num_slots; ++s) next[s] = first[s];
  for (long t = 0; t < rows; ++t)
    if (row_slots[t] >= 0) order[next[row_slots[t]]++] = t;
  return first[num_slots];
}

template <typename T>
static void shrink_rows(const T *x, long x_stride, long rows, const T *a, long r_total, long in,
                        const int64_t *row_slots, float *h, int nthreads) {
  const long items = rows * r_total;  // one (row, rank row) dot each
  parallel_for(items, (items + 4L * nthreads - 1) / (4L * nthreads), nthreads, items * in >= (1L << 16),
               [&](long lo, long hi) {
                 for (long i = lo; i < hi; ++i) {
                   const long t = i / r_total, r = i % r_total, s = row_slots[t];
                   if (s < 0) {
                     h[i] = 0.0f;
                     continue;
                   }
                   const T *xr = x + t * x_stride, *ar = a + (s * r_total + r) * in;
                   float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                   for (long k = 0; k < in; ++k) acc += to_f32(ar[k]) * to_f32(xr[k]);
                   h[i] = acc;
                 }
               });
}

template <typename T>
static void expand_rows(T *y, long y_stride, const float *h, long h_stride, const T *b, long n, long rank,
                        const long *first, const long *order, long num_slots, int nthreads, long work) {
  const long blocks = (n + kOutBlock - 1) / kOutBlock;
  parallel_for(blocks, 1, nthreads, work >= (1L << 15), [&](long lo, long hi) {
    float bt[kMaxRank * kOutBlock];  // B's block transposed: bt[r * kOutBlock + j] = B[n0 + j][r]
    float acc[kOutBlock];
    for (long blk = lo; blk < hi; ++blk) {
      const long n0 = blk * kOutBlock, nb = n - n0 < kOutBlock ? n - n0 : kOutBlock;
      for (long s = 0; s < num_slots; ++s) {
        const long count = first[s + 1] - first[s];
        if (!count) continue;
        const T *bs = b + (s * n + n0) * rank;
        if (count > 1)
          for (long j = 0; j < nb; ++j)
            for (long r = 0; r < rank; ++r) bt[r * kOutBlock + j] = to_f32(bs[j * rank + r]);
        for (long g = first[s]; g < first[s + 1]; ++g) {
          const long t = order[g];
          const float *ht = h + t * h_stride;
          if (count > 1) {
            for (long j = 0; j < nb; ++j) acc[j] = 0.0f;
            for (long r = 0; r < rank; ++r) {
              const float hr = ht[r], *row = bt + r * kOutBlock;
#pragma omp simd
              for (long j = 0; j < nb; ++j) acc[j] += hr * row[j];
            }
          } else {
            for (long j = 0; j < nb; ++j) {
              const T *bj = bs + j * rank;
              float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
              for (long r = 0; r < rank; ++r) sum += to_f32(bj[r]) * ht[r];
              acc[j] = sum;
            }
          }
          T *yt = y + t * y_stride + n0;
#pragma omp simd
          for (long j = 0; j < nb; ++j) from_f32(to_f32(yt[j]) + acc[j], &yt[j]);
        }
      }
    }
  });
}

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// the largest rank lora_expand takes
long CK_FN(lora_max_rank)(void) { return kMaxRank; }

// h [rows, r_total] (float32, row stride r_total) = A[slot(t)] @ x[t] for each row t with
// row_slots[t] >= 0, 0 elsewhere; a [num_slots, r_total, in] and x (row stride x_stride) in
// dtype (CK_F32 / CK_BF16). Returns -1 for another dtype.
int CK_FN(lora_shrink)(int dtype, const void *x, long x_stride, long rows, const void *a, long r_total, long in,
                       const int64_t *row_slots, float *h, int nthreads) {
  if (dtype == CK_F32)
    shrink_rows((const float *)x, x_stride, rows, (const float *)a, r_total, in, row_slots, h, nthreads);
  else if (dtype == CK_BF16)
    shrink_rows((const bf16_t *)x, x_stride, rows, (const bf16_t *)a, r_total, in, row_slots, h, nthreads);
  else
    return -1;
  return 0;
}

// y[t, 0 .. n) += B[slot(t)] @ h[t, 0 .. rank) for each row t with row_slots[t] >= 0 (y points
// at the part's first column, row stride y_stride; h float32, row stride h_stride; b
// [num_slots, n, rank]; y and b in dtype). Returns -1 for another dtype or a rank above 256,
// -2 when the rows' groups could not be allocated.
int CK_FN(lora_expand)(int dtype, void *y, long y_stride, const float *h, long h_stride, const void *b, long n,
                       long rank, const int64_t *row_slots, long rows, long num_slots, int nthreads) {
  if ((dtype != CK_F32 && dtype != CK_BF16) || rank > kMaxRank) return -1;
  long *first = (long *)malloc(sizeof(long) * (2 * num_slots + 1 + rows));
  if (!first) return -2;
  long *order = first + 2 * num_slots + 1;
  const long work = group_rows(row_slots, rows, num_slots, first, order) * n * rank;
  if (dtype == CK_F32)
    expand_rows((float *)y, y_stride, h, h_stride, (const float *)b, n, rank, first, order, num_slots, nthreads,
                work);
  else
    expand_rows((bf16_t *)y, y_stride, h, h_stride, (const bf16_t *)b, n, rank, first, order, num_slots,
                nthreads, work);
  free(first);
  return 0;
}

}  // extern "C"
