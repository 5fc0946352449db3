// AVX512_BF16 builds: the outer-product register tile of the bfloat16 products (gemm_bf16 in
// matvec_bf16.h, linear_bf16w in encoder.cpp), as oneDNN's AVX512_BF16 kernels: weights packed
// in groups of kOpW = 64 rows, k-pairs x rows ([k/2][64 rows][2]: one 32-bit pair per row); a
// tile of kOpX = 6 activation rows x 4 vectors of 16 output rows takes, per k-pair, one
// broadcast pair of each activation row and one vdpbf16ps per accumulator (24 of 32
// registers), with no horizontal sums. A tile may also pull a quarter of the next group's panel
// toward the core (`next`: one 64-byte line per k-pair, kp lines), so that the first kOpC tiles
// of a group bring the next group in and it starts warm: a product whose weights come from
// memory (lm_head, the 32-row decode steps) otherwise waits on it at each group's first tile.
// Included inside a kernel source's CK_NS namespace.
#pragma once

#include <type_traits>

#if defined(__AVX512BF16__)
static const int kOpX = 6;          // activation rows of a tile
static const int kOpC = 4;          // vectors of 16 output rows of a tile
static const int kOpW = 16 * kOpC;  // weight rows of a packed group

// fast_exp (common.h) on 16 lanes, lane for lane the same values as the compiler's vectorized
// fast_exp (silu_and_mul's)
static inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// acc = x rows t0 .. t0+TX (bfloat16, row stride xs) times C <= kOpC vectors of 16 columns of a
// packed group (wp: its first column, kp k-pairs of kOpW columns), stored as
// out_tile[t * kOpW + column]; prefetches the kp lines from `next` unless NULL
template <int TX, int C>
static inline void op_tile(const uint32_t *wp, long kp, const bf16_t *x, long xs, float *out_tile,
                           const uint32_t *next) {
  __m512 acc[TX][C];
  for (int t = 0; t < TX; ++t)
    for (int c = 0; c < C; ++c) acc[t][c] = _mm512_setzero_ps();
  for (long p = 0; p < kp; ++p) {
    if (next) _mm_prefetch((const char *)(next + 16 * p), _MM_HINT_T0);
    __m512bh w[C];
    for (int c = 0; c < C; ++c) w[c] = (__m512bh)_mm512_loadu_si512(wp + p * kOpW + 16 * c);
    for (int t = 0; t < TX; ++t) {
      int32_t pair;
      memcpy(&pair, x + t * xs + 2 * p, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int c = 0; c < C; ++c) acc[t][c] = _mm512_dpbf16_ps(acc[t][c], xv, w[c]);
    }
  }
  for (int t = 0; t < TX; ++t)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out_tile + t * kOpW + 16 * c, acc[t][c]);
}

// op_tile on the first tx <= kOpX rows
template <int C>
static inline void op_tile_rows(long tx, const uint32_t *wp, long kp, const bf16_t *x, long xs, float *out_tile,
                                const uint32_t *next) {
  switch (tx) {
    case 1: op_tile<1, C>(wp, kp, x, xs, out_tile, next); break;
    case 2: op_tile<2, C>(wp, kp, x, xs, out_tile, next); break;
    case 3: op_tile<3, C>(wp, kp, x, xs, out_tile, next); break;
    case 4: op_tile<4, C>(wp, kp, x, xs, out_tile, next); break;
    case 5: op_tile<5, C>(wp, kp, x, xs, out_tile, next); break;
    default: op_tile<6, C>(wp, kp, x, xs, out_tile, next); break;
  }
}

// out rows t < tx (T, row stride n) = the tile's rows (kOpW floats apart) times scale (NULL: 1)
// plus bias, rw <= kOpW columns, 16 at a time (bfloat16 out: vcvtneps2bf16, round to nearest
// even as from_f32, a float32 denormal to zero); scale and bias hold kOpW values, those past rw
// unread into the output
template <typename T>
static inline void op_tile_out(const float *tile, long tx, long rw, const float *scale, const float *bias, T *out,
                               long n) {
  for (long t = 0; t < tx; ++t)
    for (long r = 0; r < rw; r += 16) {
      const __mmask16 m = rw - r >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (rw - r)) - 1);
      const __m512 v = _mm512_loadu_ps(tile + t * kOpW + r), b = _mm512_loadu_ps(bias + r);
      const __m512 y = scale ? _mm512_fmadd_ps(v, _mm512_loadu_ps(scale + r), b) : _mm512_add_ps(v, b);
      if constexpr (std::is_same<T, bf16_t>::value)
        _mm256_mask_storeu_epi16(out + t * n + r, m, (__m256i)_mm512_cvtneps_pbh(y));
      else
        _mm512_mask_storeu_ps(out + t * n + r, m, y);
    }
}
#endif  // __AVX512BF16__
