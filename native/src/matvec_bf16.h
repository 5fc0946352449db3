// AVX512_BF16 builds (avx512bf16, avx512amx): bfloat16 compute (T = bf16_t) from kPanelMin
// activation rows without the tile unit (Zen 4/5, or AMX below kAmxMinRows rows). An outer
// product, as oneDNN's AVX512_BF16 kernels: each group of kOpW = 64 weight rows is dequantized
// as the float32 panel kernel does it (dequant_rows), rounded to bfloat16 and packed in k-pairs
// ([k/2][64 rows][2]: one 32-bit pair per row), once for all activation rows; a tile of kOpX = 6
// activation rows x 4 vectors of 16 output rows then takes, per k-pair, one broadcast pair of
// each activation row and one vdpbf16ps per accumulator (24 of 32 registers), with no horizontal
// sums. The result is the float32-accumulated product of the bfloat16 activations with the
// weights rounded to bfloat16 (torch's bfloat16 linear on those weights). Included by matvec.cpp
// after dequant_rows.
#pragma once

#include "bf16_tile.h"

#if defined(__AVX512BF16__)
// out[rows, n] = x[rows, k] (bfloat16, row stride xs) @ W^T, W rows in format QT (an x8 code
// read as stored). Returns -1 if the packing buffers could not be had.
template <int QT>
static int gemm_bf16(const uint8_t *w, const float *row_scale, const bf16_t *x, long xs, long rows, long n,
                     long k, bf16_t *out, const void *bias, int bias_dt, int nthreads) {
  const long rb = row_bytes(row_format(QT), k), nb = k / kBlock, kp = k / 2, groups = (n + kOpW - 1) / kOpW;
  int failed = 0;
  parallel_for(groups, 1, nthreads, true, [&](long lo, long hi) {
    float *wf = (float *)aligned_alloc(64, kOpW * k * sizeof(float));
    uint32_t *wp = (uint32_t *)aligned_alloc(64, kp * kOpW * sizeof(uint32_t));
    if (!wf || !wp) {
      __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
      free(wf);
      free(wp);
      return;
    }
    alignas(64) float tile[kOpX * kOpW];
    for (long g = lo; g < hi; ++g) {
      const long j = kOpW * g, rw = n - j < kOpW ? n - j : kOpW;
      if (QT == CK_F32W)
        memcpy(wf, w + j * rb, rw * k * sizeof(float));
      else
        dequant_rows<QT>(w, rb, nb, j, rw, wf);
      for (long r = 0; r < kOpW; ++r) {  // row r's pairs, rounded to bfloat16, into column r
        if (r >= rw) {
          for (long p = 0; p < kp; ++p) wp[p * kOpW + r] = 0;
          continue;
        }
        for (long i = 0; i < k; i += 32) {
          alignas(64) uint32_t pairs[16];
          _mm512_store_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(wf + r * k + i + 16),
                                                                 _mm512_loadu_ps(wf + r * k + i)));
          for (int q = 0; q < 16; ++q) wp[(i / 2 + q) * kOpW + r] = pairs[q];
        }
      }
      float scale[kOpW], bj[kOpW];
      row_params(row_scale, bias, bias_dt, j, rw, scale, bj);
      for (long t0 = 0; t0 < rows; t0 += kOpX) {
        const long tx = rows - t0 < kOpX ? rows - t0 : kOpX;
        const bf16_t *xt = x + t0 * xs;
        op_tile_rows<kOpC>(tx, wp, kp, xt, xs, tile, NULL);
        op_tile_out(tile, tx, rw, scale, bj, out + t0 * n + j, n);
      }
    }
    free(wf);
    free(wp);
  });
  return failed ? -1 : 0;
}
#endif  // __AVX512BF16__
