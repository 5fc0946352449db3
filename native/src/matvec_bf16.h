// AVX512_BF16 builds (avx512bf16, avx512amx): bfloat16 compute (T = bf16_t) from kPanelMin
// activation rows without the tile unit (Zen 4/5, or AMX below kAmxMinRows rows). Each group
// of kBfW weight rows is dequantized as the float32 panel kernel does it (dequant_rows) and
// rounded to bfloat16 once; a kBfX x kBfW register tile then takes 32 k-values of a row pair
// per vdpbf16ps (two bfloat16 products a float32 lane), twice the float32 FMA rate, on the
// activations as they are (no float32 copy). The result is the float32-accumulated product of
// the bfloat16 activations with the weights rounded to bfloat16 (torch's bfloat16 linear on
// those weights), where the float32 kernels use the exact dequantized weights. Included by
// matvec.cpp after dequant_rows.
#pragma once

#if defined(__AVX512BF16__)
// activation rows x weight rows of the register tile: 4 x 4 = 16 accumulators + 4 weight
// vectors + 1 activation vector of the 32 zmm registers
static const int kBfX = 4, kBfW = 4;

// out[i] = the lane sum of v[i], i < 16: three rounds of pairwise shuffles and adds (45 ops,
// where 16 separate reductions take ~130)
static inline void hsum16x16(const __m512 v[16], float *out) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)  // 128-bit block q of b[i]: v[2i] and v[2i+1] interleaved, 2 lanes each summed
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // block q of c[i]: block q's sums of v[4i .. 4i+3]
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 p = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(3, 1, 3, 1))));
}

// sums[t * RW + r] = activation row t . panel row r over k (k a multiple of 32); sums holds 16
template <int TX, int RW>
static inline void bf16_tile(const bf16_t *wp, long k, const bf16_t *x, long xs, float *sums) {
  __m512 acc[TX][RW];
  for (int t = 0; t < TX; ++t)
    for (int r = 0; r < RW; ++r) acc[t][r] = _mm512_setzero_ps();
  for (long i = 0; i < k; i += 32) {
    __m512bh w[RW];
    for (int r = 0; r < RW; ++r) w[r] = (__m512bh)_mm512_loadu_si512(wp + r * k + i);
    for (int t = 0; t < TX; ++t) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + t * xs + i);
      for (int r = 0; r < RW; ++r) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv, w[r]);
    }
  }
  __m512 flat[16];
  for (int i = 0; i < 16; ++i) flat[i] = i < TX * RW ? acc[i / RW][i % RW] : _mm512_setzero_ps();
  hsum16x16(flat, sums);
}

template <int RW>
static inline void bf16_rows(const bf16_t *wp, long k, const bf16_t *x, long xs, long tx, float *sums) {
  switch (tx) {  // tx <= kBfX = 4
    case 1: bf16_tile<1, RW>(wp, k, x, xs, sums); break;
    case 2: bf16_tile<2, RW>(wp, k, x, xs, sums); break;
    case 3: bf16_tile<3, RW>(wp, k, x, xs, sums); break;
    default: bf16_tile<4, RW>(wp, k, x, xs, sums); break;
  }
}

// out[rows, n] = x[rows, k] (bfloat16, row stride xs) @ W^T, W rows in format QT (an x8 code
// read as stored). Returns -1 if the panel buffers could not be had.
template <int QT>
static int gemm_bf16(const uint8_t *w, const float *row_scale, const bf16_t *x, long xs, long rows, long n,
                     long k, bf16_t *out, const void *bias, int bias_dt, int nthreads) {
  const long rb = row_bytes(row_format(QT), k), nb = k / kBlock, groups = (n + kBfW - 1) / kBfW;
  long xblock = (256L << 10) / (k * (long)sizeof(bf16_t)) / kBfX * kBfX;  // ~256 KB of x in L2
  xblock = xblock < kBfX ? kBfX : xblock;
  int failed = 0;
  parallel_for(groups, row_chunk(groups, nthreads), nthreads, true, [&](long lo, long hi) {
    float *wf = (float *)aligned_alloc(64, kBfW * k * sizeof(float));
    bf16_t *wp = (bf16_t *)aligned_alloc(64, kBfW * k * sizeof(bf16_t));
    if (!wf || !wp) {
      __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
      free(wf);
      free(wp);
      return;
    }
    for (long x0 = 0; x0 < rows; x0 += xblock) {
      const long x1 = rows - x0 < xblock ? rows : x0 + xblock;
      for (long g = lo; g < hi; ++g) {
        const long j = kBfW * g, rw = n - j < kBfW ? n - j : kBfW;
        if (QT == CK_F32W)
          memcpy(wf, w + j * rb, rw * k * sizeof(float));
        else
          dequant_rows<QT>(w, rb, nb, j, rw, wf);
        for (long i = 0; i < rw * k; i += 32)  // 32 floats -> 32 bfloat16, round to nearest even
          _mm512_storeu_si512(wp + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(wf + i + 16),
                                                                   _mm512_loadu_ps(wf + i)));
        float scale[kBfW], bj[kBfW];
        row_params(row_scale, bias, bias_dt, j, rw, scale, bj);
        for (long t0 = x0; t0 < x1; t0 += kBfX) {
          const long tx = x1 - t0 < kBfX ? x1 - t0 : kBfX;
          float sums[kBfX * kBfW];
          switch (rw) {  // rw <= kBfW = 4
            case 1: bf16_rows<1>(wp, k, x + t0 * xs, xs, tx, sums); break;
            case 2: bf16_rows<2>(wp, k, x + t0 * xs, xs, tx, sums); break;
            case 3: bf16_rows<3>(wp, k, x + t0 * xs, xs, tx, sums); break;
            default: bf16_rows<4>(wp, k, x + t0 * xs, xs, tx, sums); break;
          }
          for (long t = 0; t < tx; ++t)
            for (long r = 0; r < rw; ++r) from_f32(sums[t * rw + r] * scale[r] + bj[r], &out[(t0 + t) * n + j + r]);
        }
      }
    }
    free(wf);
    free(wp);
  });
  return failed ? -1 : 0;
}
#endif  // __AVX512BF16__
