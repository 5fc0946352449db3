// matvec.cpp's AVX-512 bodies: the 16-float row dot product and its block decode (AVX-512
// builds; elsewhere this file adds nothing). A part of matvec.cpp's translation unit, included
// inside its namespace ahead of row_dot, which calls row_dot16; uses blocks.h, simd.h and
// matvec.cpp's kPrefetchAhead.
#pragma once

#if defined(__AVX512F__)
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and int8 rows at 16 floats a vector (the v8 path above keeps the
// K-quants and float32 rows): a block is two registers, dequantized to the same values as
// decode_block, so only the summation order differs. A Q4 block looks its values up in
// the block's table of 16 (vpermps reads the low 4 bits of each lane) instead of
// converting every nibble: the lookup, not the width, is the gain (a plain 512-bit port of the
// v8 code decodes no faster than it).
static constexpr bool has_row_dot16(int qt) {
  return qt == CK_Q8_0 || qt == CK_Q4_0 || qt == CK_Q4_1 || qt == CK_INT8 || qt == CK_Q5_0 || qt == CK_Q5_1 ||
         qt == CK_E4M3W;
}

template <int QT>
__attribute__((always_inline)) static inline void decode_block16(const uint8_t *p, __m512 w[2]) {
  if (QT == CK_Q8_0 || QT == CK_INT8) {
    const uint8_t *q = p + (QT == CK_INT8 ? 0 : 2);
    for (int h = 0; h < 2; ++h) {
      w[h] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * h))));
      if (QT == CK_Q8_0) w[h] = _mm512_mul_ps(_mm512_set1_ps(read_half(p)), w[h]);
    }
    return;
  }
  if (QT == CK_E4M3W) {  // fp8.h's values built in the lanes (code 0x7f, a NaN, reads 480 here)
    const __m512i sign_bit = _mm512_set1_epi32(0x80), magnitude = _mm512_set1_epi32(0x7f);
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
      const __m512i mag = _mm512_and_si512(v, magnitude);
      // normal: exponent rebiased 7 -> 127, mantissa moved up; subnormal (exponent 0): man * 2^-9
      const __m512i rebiased = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
      const __m512 normal = _mm512_castsi512_ps(rebiased);
      const __m512 small = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0.001953125f));
      const __m512 f = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)), normal, small);
      const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, sign_bit), 24);
      w[h] = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
    }
    return;
  }
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 d = _mm512_set1_ps(read_half(p));
  if (QT == CK_Q5_0 || QT == CK_Q5_1) {  // the 32 values of the codes in two tables, picked by 5-bit codes
    const __m512 m = QT == CK_Q5_1 ? _mm512_set1_ps(read_half(p + 2)) : _mm512_mul_ps(d, _mm512_set1_ps(-16.0f));
    const __m512 low = _mm512_fmadd_ps(d, iota, m);
    const __m512 high = _mm512_fmadd_ps(d, _mm512_add_ps(iota, _mm512_set1_ps(16.0f)), m);
    const uint8_t *qh = p + (QT == CK_Q5_1 ? 4 : 2);
    uint32_t h;
    memcpy(&h, qh, 4);  // x86: little-endian, as stored
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i one = _mm512_set1_epi32(1), hv = _mm512_set1_epi32((int)h);
    const __m512i fifth0 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(hv, lanes), one), 4);
    const __m512i lanes16 = _mm512_add_epi32(lanes, _mm512_set1_epi32(16));
    const __m512i fifth1 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(hv, lanes16), one), 4);
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + 4)));
    const __m512i codes0 = _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(15)), fifth0);
    w[0] = _mm512_permutex2var_ps(low, codes0, high);
    w[1] = _mm512_permutex2var_ps(low, _mm512_or_si512(_mm512_srli_epi32(v, 4), fifth1), high);
    return;
  }
  // the 16 values d * (q - 8) (Q4_0) or d * q + m (Q4_1), rounded as the reference's
  const __m512 table = QT == CK_Q4_0 ? _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)))
                                     : _mm512_fmadd_ps(d, iota, _mm512_set1_ps(read_half(p + 2)));
  // byte i: value i in the low nibble, i + 16 in the high one
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + (QT == CK_Q4_1 ? 4 : 2))));
  w[0] = _mm512_permutexvar_ps(v, table);
  w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
}

// row_dot's contract for the formats of has_row_dot16: two FMA chains per activation row
// (the two halves of each block)
template <int QT, int TT>
static inline void row_dot16(const uint8_t *wr, const float *x, long xs, long nb, float *sums) {
  __m512 acc[TT][2];
  for (int t = 0; t < TT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  const long bb = block_bytes(QT);
  for (long b = 0; b < nb; ++b) {
    __m512 w[2];
    __builtin_prefetch(wr + b * bb + kPrefetchAhead);
    decode_block16<QT>(wr + b * bb, w);
    for (int t = 0; t < TT; ++t) {
      const float *xb = x + t * xs + b * kBlock;
      acc[t][0] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xb), acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xb + 16), acc[t][1]);
    }
  }
  for (int t = 0; t < TT; ++t) {
    const __m512 s = _mm512_add_ps(acc[t][0], acc[t][1]);
    sums[t] = v8_hsum(_mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1)));
  }
}
#endif
