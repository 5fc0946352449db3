// matvec.cpp's tile kernels (AMX builds; elsewhere this file adds nothing). A part of
// matvec.cpp's translation unit, included inside its namespace after dequant_rows: amx_matmul is
// matmul_act's first choice. Uses matvec.cpp's decode_block and row_format, matvec_avx512.h's
// has_row_dot16 and decode_block16, blocks.h and amx.h.
#pragma once

#if defined(__AMX_BF16__)
// AMX builds: from kAmxMinRows activation rows, the float32 products on the tile unit. A
// float32 value is hi + lo, two bfloat16: hi it rounded, lo the rest rounded (8 + 8
// significant bits and a sign: Q4_0's weights, d * (q - 8), hold up to 15 and are exact), and
// x . w = xhi . whi + xhi . wlo + xlo . whi with float32 accumulation: three TDPBF16PS where
// the float32 FMAs would take ~16x the time; xlo . wlo and lo's rounding are ~2^-17 of the
// product. Two kernels (amx_matmul picks): amx_gemm for many rows (each task decodes 32
// weight rows' blocks, splits them into B tiles and runs every activation row over them 16 at
// a time) and amx_gemm_few for fewer (the weights as the A tiles).

// from this many rows amx_gemm, below it amx_gemm_few: each the faster on its side (amx_gemm_few
// at 160 rows, the CPU step budget on 2 cores; amx_gemm from 256)
static const long kAmxManyRows = 192;
static const long kAmxBlockBytes = 1L << 20;  // activation tiles amx_gemm takes at a time (L2: 2 MB a core)
static const long kAmxWeightAhead = 1024;  // bytes of an x8 group's blocks amx_x8_rows prefetches ahead
static const long kAmxSteps = 4;  // 32-value steps of k a pass over the rows takes (4 KB of B tiles each)

// 32 rows of floats p [32, k] (rows stride apart, those from `valid` on read as zeros) as B
// tiles: for each 32-value step s of k, column blocks c = 0, 1 (rows 16c ..), hi then lo, 16
// rows (pairs of k) x 16 columns x 2 values (TDPBF16PS's pairs layout); 2048 values a step. A
// row's 16 pairs of a step become a column of the tile: a transpose of 16 rows' pairs
static inline void amx_pack_columns(const float *p, long stride, long valid, long s0, long s1, uint16_t *bp) {
  for (long s = s0; s < s1; ++s)
    for (int c = 0; c < 2; ++c) {
      __m512i hi[16], lo[16], rows[16];
      for (int j = 0; j < 16; ++j) {
        hi[j] = lo[j] = _mm512_setzero_si512();
        if (16 * c + j < valid) split32(p + (16 * c + j) * stride + 32 * s, &hi[j], &lo[j]);
      }
      uint16_t *tile = bp + s * 2048 + c * 1024;
      transpose16(hi, rows);
      for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(tile + 32 * kk, rows[kk]);
      transpose16(lo, rows);
      for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(tile + 512 + 32 * kk, rows[kk]);
    }
}

// amx_pack_columns in bfloat16 compute: rows of bfloat16 values as they are, hi tiles only (the
// lo ones would be zeros nobody multiplies), in its layout
static inline void amx_pack_columns_hi(const bf16_t *p, long stride, long valid, long s0, long s1, uint16_t *bp) {
  for (long s = s0; s < s1; ++s)
    for (int c = 0; c < 2; ++c) {
      __m512i hi[16], rows[16];
      for (int j = 0; j < 16; ++j)
        hi[j] = 16 * c + j < valid ? _mm512_loadu_si512(p + (16 * c + j) * stride + 32 * s) : _mm512_setzero_si512();
      uint16_t *tile = bp + s * 2048 + c * 1024;
      transpose16(hi, rows);
      for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(tile + 32 * kk, rows[kk]);
    }
}

// C0 += A B0 and C1 += A B1 in hi + lo products (tiles 0, 1): A's hi and lo tiles (16 rows,
// `stride` bytes apart) and b's four B tiles (B0 hi, B0 lo, B1 hi, B1 lo; 1 KB each) loaded
// into tiles 2 .. 7. The two C tiles' products alternate
static inline void amx_products(const uint16_t *ahi, const uint16_t *alo, long stride, const uint16_t *b) {
  _tile_loadd(2, ahi, stride);
  _tile_loadd(3, alo, stride);
  _tile_loadd(4, b, 64);
  _tile_loadd(5, b + 512, 64);
  _tile_loadd(6, b + 1024, 64);
  _tile_loadd(7, b + 1536, 64);
  _tile_dpbf16ps(0, 2, 4);  // hi . hi
  _tile_dpbf16ps(1, 2, 6);
  _tile_dpbf16ps(0, 3, 4);  // A lo . B hi
  _tile_dpbf16ps(1, 3, 6);
  _tile_dpbf16ps(0, 2, 5);  // A hi . B lo
  _tile_dpbf16ps(1, 2, 7);
}

// bfloat16 compute (T = bf16_t): the activations are bfloat16 values, so their lo halves are 0,
// and the weights are rounded to bfloat16 once decoded (as a bfloat16 checkpoint's are): one
// product, hi . hi, where float32 takes three. C0 += A B0 and C1 += A B1 from A's hi tile and
// b's B0 hi and B1 hi tiles (the layout of amx_products)
static inline void amx_products_hi(const uint16_t *ahi, long stride, const uint16_t *b) {
  _tile_loadd(2, ahi, stride);
  _tile_loadd(4, b, 64);
  _tile_loadd(6, b + 1024, 64);
  _tile_dpbf16ps(0, 2, 4);
  _tile_dpbf16ps(1, 2, 6);
}

// out[t, q] = c[t, q] * scale[q] + bias[q] for t < rows, q < rw (c: rows of 32 floats; out:
// rows n apart). Rows of 32 that fill whole cache lines (float32: two, bfloat16: one) go out as
// streaming stores: they are not read again in this product, and as ordinary stores (a 448-row
// block's outputs are 2.7 MB at n = 1536) they evicted from L2 the activation tiles every further
// weight group reads (bfloat16's streamed: the default model's four shapes at 512 rows 1.13x, its
// 512-token bfloat16 prefill 1.16x as fast as with masked ordinary stores, on an AMX Xeon)
template <typename T>
static inline void amx_store_out(const float *c, const float *scale, const float *bias, long rows, long rw, long n,
                                 T *out) {
  if constexpr (std::is_same<T, float>::value)
    if (rw == 32 && ((uintptr_t)out | (n * sizeof(T))) % 64 == 0) {
      const __m512 s0 = _mm512_loadu_ps(scale), s1 = _mm512_loadu_ps(scale + 16);
      const __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + 16);
      for (long t = 0; t < rows; ++t) {
        _mm512_stream_ps(out + t * n, _mm512_fmadd_ps(_mm512_load_ps(c + 32 * t), s0, b0));
        _mm512_stream_ps(out + t * n + 16, _mm512_fmadd_ps(_mm512_load_ps(c + 32 * t + 16), s1, b1));
      }
      return;
    }
  if constexpr (std::is_same<T, bf16_t>::value) {  // a row's 32 outputs rounded at once
    const __m512 s0 = _mm512_loadu_ps(scale), s1 = _mm512_loadu_ps(scale + 16);
    const __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + 16);
    if (rw == 32 && ((uintptr_t)out | (n * sizeof(T))) % 64 == 0) {  // whole lines: streamed
      for (long t = 0; t < rows; ++t) {
        const __m512 v0 = _mm512_fmadd_ps(_mm512_load_ps(c + 32 * t), s0, b0);
        const __m512 v1 = _mm512_fmadd_ps(_mm512_load_ps(c + 32 * t + 16), s1, b1);
        _mm512_stream_si512((__m512i *)(out + t * n), (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
      }
      return;
    }
    const __mmask32 valid = (__mmask32)(rw == 32 ? 0xffffffffu : (1u << rw) - 1);
    for (long t = 0; t < rows; ++t) {
      const __m512 v0 = _mm512_fmadd_ps(_mm512_load_ps(c + 32 * t), s0, b0);
      const __m512 v1 = _mm512_fmadd_ps(_mm512_load_ps(c + 32 * t + 16), s1, b1);
      _mm512_mask_storeu_epi16(out + t * n, valid, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
    }
    return;
  }
  for (long t = 0; t < rows; ++t)
    for (long q = 0; q < rw; ++q) from_f32(c[t * 32 + q] * scale[q] + bias[q], &out[t * n + q]);
}

// block b of weight row r (format QT, an x8 code read as stored) as 2 x 16 floats
template <int QT>
static inline void amx_weight_block(const uint8_t *w, long rb, long nb, long r, long b, __m512 v[2]) {
  constexpr int RQT = row_format(QT);
  uint8_t stored[40];  // the largest block: U8FX8's and S8FX8's
  const uint8_t *row = w + r * rb;
  long bi = b;
  if constexpr (is_x8(QT)) {
    x8_row_block<RQT>(w, nb, r, b, stored);
    row = stored, bi = 0;
  }
  if constexpr (has_row_dot16(RQT)) {
    decode_block16<RQT>(row + bi * block_bytes(RQT), v);
  } else {
    v8 q[4];
    decode_block<RQT>(row, bi, q);
    v[0] = _mm512_insertf32x8(_mm512_castps256_ps512(q[0]), q[1], 1);
    v[1] = _mm512_insertf32x8(_mm512_castps256_ps512(q[2]), q[3], 1);
  }
}

// row r of a step's A tiles (hi at a, lo 512 values on): the split of v, or zeros where the
// row is past the weights (v then unread)
static inline void amx_store_row(uint16_t *a, long r, const __m512 v[2], bool valid) {
  __m512i hi = _mm512_setzero_si512(), lo = hi;
  if (valid) split32(v[0], v[1], &hi, &lo);
  _mm512_store_si512(a + 32 * r, hi);
  _mm512_store_si512(a + 512 + 32 * r, lo);
}
// the hi half only (bfloat16 compute: the weights rounded to nearest even)
static inline void amx_store_row_hi(uint16_t *a, long r, const __m512 v[2], bool valid) {
  _mm512_store_si512(a + 32 * r, valid ? (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]) : _mm512_setzero_si512());
}

// x8 formats whose 8 rows of a block amx_x8_rows decodes at once
static constexpr bool has_x8_rows(int qt) { return qt == CK_Q8_0X8 || qt == CK_Q4_0X8 || qt == CK_Q4_1X8; }

// block b of the 8 rows of x8 group g (an x8 code of has_x8_rows), each as 2 x 16 floats, the
// values of decode_block16: a row's 4-byte pieces of codes lie 32 bytes apart (blocks.h), so
// two-register permutes gather 4 rows' pieces into the 4 lanes of a register (x8_row_block's
// byte copies, read back as one vector, stalled every row on store forwarding)
template <int QT>
static inline void amx_x8_rows(const uint8_t *w, long nb, long g, long b, __m512 v[8][2]) {
  constexpr int RQT = row_format(QT);
  const uint8_t *p = w + (g * nb + b) * 8 * block_bytes(RQT);
  for (int l = 0; l < 8 * block_bytes(RQT); l += 64) _mm_prefetch((const char *)p + kAmxWeightAhead + l, _MM_HINT_T0);
  alignas(32) float d[8], m[8];  // the rows' scales (Q4_1: and mins), 8 halves each
  _mm256_store_ps(d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
  if (RQT == CK_Q4_1) _mm256_store_ps(m, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))));
  const uint8_t *q = p + (RQT == CK_Q4_1 ? 32 : 16);
  // lane 4 i + c: piece c of row i, dword 8 c + i of the pieces (rows 4 .. 7: + 4)
  const __m512i idx = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
  const __m512i z0 = _mm512_loadu_si512(q), z1 = _mm512_loadu_si512(q + 64);
  for (int h = 0; h < 2; ++h) {
    const __m512i ix = _mm512_add_epi32(idx, _mm512_set1_epi32(4 * h));
    const __m512i lo = _mm512_permutex2var_epi32(z0, ix, z1);  // Q8_0: bytes 0-15, Q4: all 16
    __m512i hi = lo;
    if (RQT == CK_Q8_0)  // bytes 16-31: pieces 4-7
      hi = _mm512_permutex2var_epi32(_mm512_loadu_si512(q + 128), ix, _mm512_loadu_si512(q + 192));
    for (int i = 0; i < 4; ++i) {
      const int r = 4 * h + i;
      const __m512 dv = _mm512_set1_ps(d[r]);
      __m128i c0, c1;
      switch (i) {  // the lane's index must be a constant
        case 0: c0 = _mm512_extracti32x4_epi32(lo, 0), c1 = _mm512_extracti32x4_epi32(hi, 0); break;
        case 1: c0 = _mm512_extracti32x4_epi32(lo, 1), c1 = _mm512_extracti32x4_epi32(hi, 1); break;
        case 2: c0 = _mm512_extracti32x4_epi32(lo, 2), c1 = _mm512_extracti32x4_epi32(hi, 2); break;
        default: c0 = _mm512_extracti32x4_epi32(lo, 3), c1 = _mm512_extracti32x4_epi32(hi, 3); break;
      }
      if (RQT == CK_Q8_0) {
        v[r][0] = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c0)));
        v[r][1] = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c1)));
      } else {
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 table = RQT == CK_Q4_0 ? _mm512_mul_ps(dv, _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)))
                                            : _mm512_fmadd_ps(dv, iota, _mm512_set1_ps(m[r]));
        const __m512i codes = _mm512_cvtepu8_epi32(c0);  // byte i: value i in the low nibble, i + 16 in the high one
        v[r][0] = _mm512_permutexvar_ps(codes, table);
        v[r][1] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
      }
    }
  }
}

// Weight rows j .. j + rw - 1 (rw <= 32; the rest zeros) as amx_gemm's B tiles, in
// amx_pack_columns' layout (hi, then lo unless kHiOnly): each 32-value step's blocks decoded
// straight into registers (x8 codes: 8 rows a call, amx_x8_rows), split, then transposed (a
// float32 staging copy of the rows, as dequant_rows writes it, cost a second pass and, on the x8
// layout, a store-forwarding stall a row)
template <int QT, bool kHiOnly>
static inline void amx_pack_weights(const uint8_t *w, long rb, long nb, long j, long rw, uint16_t *bp) {
  for (long s = 0; s < nb; ++s)
    for (long c = 0; c < 2; ++c) {
      __m512 v[16][2];
      if constexpr (has_x8_rows(QT)) {
        for (long h = 0; h < 2; ++h)
          if (16 * c + 8 * h < rw) amx_x8_rows<QT>(w, nb, (j + 16 * c) / 8 + h, s, v + 8 * h);
      } else {
        for (long r = 0; r < 16; ++r)
          if (16 * c + r < rw) amx_weight_block<QT>(w, rb, nb, j + 16 * c + r, s, v[r]);
      }
      __m512i hi[16], lo[16], rows[16];
      for (long r = 0; r < 16; ++r) {
        hi[r] = lo[r] = _mm512_setzero_si512();
        if (16 * c + r >= rw) continue;
        if constexpr (kHiOnly)
          hi[r] = (__m512i)_mm512_cvtne2ps_pbh(v[r][1], v[r][0]);
        else
          split32(v[r][0], v[r][1], &hi[r], &lo[r]);
      }
      uint16_t *tile = bp + s * 2048 + c * 1024;
      transpose16(hi, rows);
      for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(tile + 32 * kk, rows[kk]);
      if constexpr (!kHiOnly) {
        transpose16(lo, rows);
        for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(tile + 512 + 32 * kk, rows[kk]);
      }
    }
}

template <int QT, typename T>
static int amx_gemm(const uint8_t *w, const float *row_scale, const T *x, long xs, long rows,
                    long n, long k, T *out, const void *bias, int bias_dt, int nthreads) {
  const long rb = row_bytes(row_format(QT), k), nb = k / kBlock;
  constexpr bool kHiOnly = std::is_same<T, bf16_t>::value;  // bfloat16 compute: amx_products_hi, no lo rows
  const long padded = (rows + 15) / 16 * 16, steps = k / 32, groups = (n + 31) / 32;
  // hi rows, then (float32) lo rows
  uint16_t *a = (uint16_t *)aligned_alloc(64, (kHiOnly ? 1 : 2) * padded * k * sizeof(uint16_t));
  if (!a) return -1;
  uint16_t *alo = a + padded * k;
  parallel_for(padded, 16, nthreads, true, [&](long r_lo, long r_hi) {
    for (long r = r_lo; r < r_hi; ++r)
      for (long s = 0; s < steps; ++s) {
        __m512i hi = _mm512_setzero_si512(), lo = hi;
        const T *xr = x + r * xs + 32 * s;
        if constexpr (kHiOnly) {  // bfloat16 rows: copied
          if (r < rows) hi = _mm512_loadu_si512(xr);
        } else {
          if (r < rows) split32(xr, &hi, &lo);
          _mm512_store_si512(alo + r * k + 32 * s, lo);
        }
        _mm512_store_si512(a + r * k + 32 * s, hi);
      }
  });
  int failed = 0;
  parallel_for(groups, 1, nthreads, true, [&](long lo_g, long hi_g) {
    uint16_t *bp = (uint16_t *)aligned_alloc(64, steps * 2048 * sizeof(uint16_t));
    float *c = (float *)aligned_alloc(64, padded * 32 * sizeof(float));  // [padded rows, 32 columns]
    if (!bp || !c) {
      __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
      free(bp), free(c);
      return;
    }
    amx_configure();
    for (long g = lo_g; g < hi_g; ++g) {
      const long j = 32 * g, rw = n - j < 32 ? n - j : 32;
      amx_pack_weights<QT, kHiOnly>(w, rb, nb, j, rw, bp);
      float scale[32] = {}, bj[32] = {};  // zeros past rw (the vector stores mask them out)
      row_params(row_scale, bias, bias_dt, j, rw, scale, bj);
      // kAmxSteps steps of k at a time (their 4 KB of B tiles each stay in L1) over every 16
      // rows, the sums parked in c between: one B tile load per TDPBF16PS from L2 is slower
      for (long s0 = 0; s0 < steps; s0 += kAmxSteps) {
        const long s1 = s0 + kAmxSteps < steps ? s0 + kAmxSteps : steps;
        for (long r0 = 0; r0 < padded; r0 += 16) {
          if (s0 == 0) {
            _tile_zero(0);
            _tile_zero(1);
          } else {
            _tile_loadd(0, c + r0 * 32, 128);
            _tile_loadd(1, c + r0 * 32 + 16, 128);
          }
          for (long s = s0; s < s1; ++s) {  // the next 16 rows' A tiles fetched meanwhile
            if (r0 + 16 < padded)
              for (long i = 0; i < 16; ++i) {
                _mm_prefetch((const char *)(a + (r0 + 16 + i) * k + 32 * s), _MM_HINT_T0);
                if constexpr (!kHiOnly) _mm_prefetch((const char *)(alo + (r0 + 16 + i) * k + 32 * s), _MM_HINT_T0);
              }
            if constexpr (kHiOnly)
              amx_products_hi(a + r0 * k + 32 * s, k * 2, bp + s * 2048);
            else
              amx_products(a + r0 * k + 32 * s, alo + r0 * k + 32 * s, k * 2, bp + s * 2048);
          }
          _tile_stored(0, c + r0 * 32, 128);
          _tile_stored(1, c + r0 * 32 + 16, 128);
        }
      }
      amx_store_out(c, scale, bj, rows, rw, n, out + j);
    }
    _mm_sfence();  // the streaming stores visible before the task counts as done
    _tile_release();
    free(bp), free(c);
  });
  free(a);
  return failed ? -1 : 0;
}

// Fewer rows (batched decode): the roles swapped. The weights are the A tiles, whose rows are
// a weight row's 32-value step as it is (hi and lo straight from a block's decode, no
// transpose), and the activations the B tiles, packed once a call; 32 activation rows a pass
// with their two C tiles held over all of k. A task's 16 weight rows are decoded once (2 KB
// a step, kept for the call's further 32-row passes).
template <int QT, typename T>
static int amx_gemm_few(const uint8_t *w, const float *row_scale, const T *x, long xs, long rows,
                        long n, long k, T *out, const void *bias, int bias_dt, int nthreads) {
  constexpr bool kHiOnly = std::is_same<T, bf16_t>::value;  // bfloat16 compute: amx_products_hi
  const long rb = row_bytes(row_format(QT), k), nb = k / kBlock, steps = k / 32;
  const long passes = (rows + 31) / 32, groups = (n + 15) / 16;
  uint16_t *xb = (uint16_t *)aligned_alloc(64, passes * steps * 2048 * sizeof(uint16_t));
  if (!xb) return -1;
  parallel_for(passes * steps, 8, nthreads, true, [&](long lo, long hi) {  // (pass, step) pairs
    for (long i = lo; i < hi; ++i) {
      const long p = i / steps, s = i % steps;
      if constexpr (kHiOnly)
        amx_pack_columns_hi(x + 32 * p * xs, xs, rows - 32 * p, s, s + 1, xb + p * steps * 2048);
      else
        amx_pack_columns(x + 32 * p * xs, xs, rows - 32 * p, s, s + 1, xb + p * steps * 2048);
    }
  });
  int failed = 0;
  // a few tasks a thread: each one's buffer and tile configuration cost ~1 group's products
  const long chunk = (groups + 4L * nthreads - 1) / (4L * nthreads);
  parallel_for(groups, chunk, nthreads, true, [&](long lo_g, long hi_g) {
    uint16_t *wa = (uint16_t *)aligned_alloc(64, steps * 1024 * sizeof(uint16_t));  // a step: hi [16, 32], lo
    if (!wa) {
      __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
      return;
    }
    alignas(64) float c[2][256];  // [weight row, activation row] of the two C tiles
    amx_configure();
    for (long g = lo_g; g < hi_g; ++g) {
      const long j = 16 * g, rw = n - j < 16 ? n - j : 16;
      float scale[16] = {}, bj[16] = {};  // zeros past rw (the vector stores mask them out)
      row_params(row_scale, bias, bias_dt, j, rw, scale, bj);
      for (long p = 0; p < passes; ++p) {
        const long t0 = 32 * p, tn = rows - t0 < 32 ? rows - t0 : 32;
        _tile_zero(0);
        _tile_zero(1);
        for (long s = 0; s < steps; ++s) {
          uint16_t *a = wa + s * 1024;
          if (p == 0) {  // decoded just before their products: the decode overlaps the tiles' work
            if constexpr (has_x8_rows(QT)) {
              for (long h = 0; h < 2; ++h) {  // the 16 rows' two x8 groups
                __m512 v[8][2];
                if (8 * h < rw) amx_x8_rows<QT>(w, nb, j / 8 + h, s, v);
                for (long i = 0; i < 8; ++i)
                  if constexpr (kHiOnly)
                    amx_store_row_hi(a, 8 * h + i, v[i], 8 * h + i < rw);
                  else
                    amx_store_row(a, 8 * h + i, v[i], 8 * h + i < rw);
              }
            } else {
              for (long r = 0; r < 16; ++r) {
                __m512 v[2];
                if (r < rw) amx_weight_block<QT>(w, rb, nb, j + r, s, v);
                if constexpr (kHiOnly)
                  amx_store_row_hi(a, r, v, r < rw);
                else
                  amx_store_row(a, r, v, r < rw);
              }
            }
          }
          const uint16_t *b = xb + (p * steps + s) * 2048;
          if (kHiOnly && tn > 16) {
            amx_products_hi(a, 64, b);
          } else if (kHiOnly) {
            _tile_loadd(2, a, 64);
            _tile_loadd(4, b, 64);
            _tile_dpbf16ps(0, 2, 4);
          } else if (tn > 16) {
            amx_products(a, a + 512, 64, b);
          } else {  // one B block: its two tiles only
            _tile_loadd(2, a, 64);
            _tile_loadd(3, a + 512, 64);
            _tile_loadd(4, b, 64);
            _tile_loadd(5, b + 512, 64);
            _tile_dpbf16ps(0, 2, 4);
            _tile_dpbf16ps(0, 3, 4);
            _tile_dpbf16ps(0, 2, 5);
          }
        }
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
        if constexpr (kHiOnly) {  // 16 bfloat16 outputs a row: transposed, then one rounding and masked store
          const __m512 sv = _mm512_loadu_ps(scale), bv = _mm512_loadu_ps(bj);
          const __mmask16 valid = (__mmask16)((1u << rw) - 1);
          for (long h = 0; 16 * h < tn; ++h) {
            __m512i wrows[16], trows[16];  // C tile h: [weight row][activation row], transposed
            for (int q = 0; q < 16; ++q) wrows[q] = _mm512_load_si512(c[h] + 16 * q);
            transpose16(wrows, trows);
            for (long u = 0; u < 16 && 16 * h + u < tn; ++u) {
              const __m512 v = _mm512_fmadd_ps(_mm512_castsi512_ps(trows[u]), sv, bv);
              _mm256_mask_storeu_epi16(&out[(t0 + 16 * h + u) * n + j], valid, (__m256i)_mm512_cvtneps_pbh(v));
            }
          }
        } else {
          for (long t = 0; t < tn; ++t)
            for (long q = 0; q < rw; ++q)
              from_f32(c[t / 16][q * 16 + t % 16] * scale[q] + bj[q], &out[(t0 + t) * n + j + q]);
        }
      }
    }
    _tile_release();
    free(wa);
  });
  free(xb);
  return failed ? -1 : 0;
}

// The tile kernels' entry, on activations of the compute dtype T: amx_gemm_few below
// kAmxManyRows rows, else amx_gemm over blocks of rows whose activation tiles (float32: hi + lo,
// 4 bytes a value; bfloat16: hi, 2) stay in L2, as it reads them once for every 32 weight rows;
// a last block of fewer than kAmxManyRows rows is taken along. Returns -1 if a buffer could not
// be had.
template <int QT, typename T>
static int amx_matmul(const uint8_t *w, const float *row_scale, const T *x, long xs, long rows,
                      long n, long k, T *out, const void *bias, int bias_dt, int nthreads) {
  if (rows < kAmxManyRows) return amx_gemm_few<QT, T>(w, row_scale, x, xs, rows, n, k, out, bias, bias_dt, nthreads);
  long block = (kAmxBlockBytes / ((long)sizeof(T) * k)) / 16 * 16;
  block = block < kAmxManyRows ? kAmxManyRows : block;
  for (long r0 = 0; r0 < rows;) {
    const long r1 = rows - r0 < block + kAmxManyRows ? rows : r0 + block;
    if (amx_gemm<QT, T>(w, row_scale, x + r0 * xs, xs, r1 - r0, n, k, out + r0 * n, bias, bias_dt, nthreads)) return -1;
    r0 = r1;
  }
  return 0;
}
#endif
