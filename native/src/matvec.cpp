// Quantized linear with float32 activations, any batch: y[T, N] = x[T, K] @ W[N, K]^T + b.
// Each weight block of 32 values is dequantized exactly as the GGUF reference does it
// (Q8_0: d * q, Q4_0: d * (q - 8), Q4_1: d * q + m; Q5_0, Q5_1, the K-quants and E4M3
// codes in blocks.h) and multiplied into the float32 activations with FMAs, so the result
// is the float32 product with the dequantized weights up to float32 rounding. A few rows
// (decode): blocks dequantized in registers and streamed once (row_dot); from kPanelMin
// rows: dequantized panels and a register-tiled micro-kernel (gemm_panel), as fast here as
// torch's GEMM on the float32 weights. The ISA bodies are files of their own, included where
// their path branches off: matvec_avx512.h (row_dot16) and matvec_amx.h (the tile kernels).
#include <stdlib.h>

#include <type_traits>

#include "blocks.h"
#include "simd.h"

namespace CK_NS {

static const int kRows = 8;    // activation rows sharing one decode of a weight block
static const long kXRows = 64;  // activation rows a thread runs its weight rows over at a time
// bytes ahead of the weight row stream to prefetch (rows are contiguous: past a row's end
// are the next rows')
static const long kPrefetchAhead = 2048;

#if defined(CK_V8)
// block b of a weight row, dequantized as 4 vectors of 8: elements 0-7, 8-15, 16-23, 24-31
template <int QT>
static inline void decode_block(const uint8_t *row, long b, v8 w[4]) {
  if (is_q5(QT)) {  // the codes in bytes, then d * q + m 8 at a time
    uint8_t q[kBlock];
    float d, m;
    q5_block<QT>(row, b, q, &d, &m);
    const v8 dv = v8_set1(d), mv = v8_set1(m);
    for (int j = 0; j < 4; ++j) w[j] = v8_fma(dv, v8_from_i8(q + 8 * j), mv);
    return;
  }
  if (QT == CK_E4M3W) {
    alignas(32) float f[kBlock];
    const uint8_t *p = row + b * kBlock;
    for (int i = 0; i < kBlock; ++i) f[i] = kE4M3.v[p[i]];
    for (int j = 0; j < 4; ++j) w[j] = v8_load(f + 8 * j);
    return;
  }
  if (QT == CK_Q6_K) {  // scale * q - 32 scale: the same float as scale * (q - 32)
    uint8_t q[kBlock];
    float scales[2];
    q6k_codes(row + b / 8 * super_bytes(QT), (int)(b % 8), q, scales);
    for (int j = 0; j < 4; ++j) {
      const float sc = scales[j / 2];
      w[j] = v8_fma(v8_set1(sc), v8_from_i8(q + 8 * j), v8_set1(-32.0f * sc));
    }
    return;
  }
  if (is_k(QT)) {
    alignas(32) float f[kBlock];
    decode_k<QT>(row, b, f);
    for (int j = 0; j < 4; ++j) w[j] = v8_load(f + 8 * j);
    return;
  }
  const uint8_t *p = row + b * block_bytes(QT);
  if (QT == CK_F32W) {
    for (int j = 0; j < 4; ++j) w[j] = v8_load((const float *)p + 8 * j);
    return;
  }
  if (QT >= CK_Q4FX8) {  // a float-scaled row block (x8 panels only): d, m (d0, d1), the codes
    float s[2];
    memcpy(s, p, 8);
    const uint8_t *q = p + 8;
    const v8 d = v8_set1(s[0]), m = v8_set1(s[1]);
    if (QT == CK_Q4FX8) {
      for (int h = 0; h < 2; ++h) {
        v8 lo, hi;
        v8_nibbles(q + 8 * h, 0, &lo, &hi);
        w[h] = v8_fma(d, lo, m);
        w[h + 2] = v8_fma(d, hi, m);
      }
    } else {  // byte codes: U8FX8 0..63 (read as signed: the same), S8FX8 signed
      for (int j = 0; j < 4; ++j)
        w[j] = QT == CK_U8FX8 ? v8_fma(d, v8_from_i8(q + 8 * j), m) : v8_mul(j < 2 ? d : m, v8_from_i8(q + 8 * j));
    }
    return;
  }
  if (QT == CK_Q8_0 || QT == CK_INT8) {
    const v8 d = v8_set1(QT == CK_INT8 ? 1.0f : read_half(p));
    const uint8_t *q = p + (QT == CK_INT8 ? 0 : 2);
    for (int j = 0; j < 4; ++j) w[j] = v8_mul(d, v8_from_i8(q + 8 * j));
    return;
  }
  v8 d, m;
  if (QT == CK_Q4_1) {
    v8_half_pair(p, &d, &m);
  } else {
    d = v8_set1(read_half(p));
    m = v8_zero();
  }
  const uint8_t *q = p + (QT == CK_Q4_1 ? 4 : 2);
  for (int h = 0; h < 2; ++h) {  // byte i: element i in the low nibble, i + 16 in the high one
    v8 lo, hi;
    v8_nibbles(q + 8 * h, QT == CK_Q4_0 ? 8 : 0, &lo, &hi);
    if (QT == CK_Q4_0) {  // d * (q - 8), as the reference
      w[h] = v8_mul(d, lo);
      w[h + 2] = v8_mul(d, hi);
    } else {
      w[h] = v8_fma(d, lo, m);
      w[h + 2] = v8_fma(d, hi, m);
    }
  }
}

#include "matvec_avx512.h"  // AVX-512 builds: row_dot16

#if defined(__AVX512F__)
// row_dot for 3-8 activation rows on float32 weight rows (CK_F32W) at 16 floats a vector, two
// FMA chains a row, so speculative verification and small batches stay memory-bound: the v8
// body's one chain a row from 3 rows made a 3-row product of 1536x576 cost 2.5x a 1-row one. (One
// and two rows keep the v8 body, whose stream from memory measured faster than this one's.)
template <int TT>
static inline void row_dot_f32w(const float *wr, const float *x, long xs, long nb, float *sums) {
  __m512 acc[TT][2];
  for (int t = 0; t < TT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  for (long i = 0; i < nb * kBlock; i += kBlock) {
    const __m512 w0 = _mm512_loadu_ps(wr + i), w1 = _mm512_loadu_ps(wr + i + 16);
    for (int t = 0; t < TT; ++t) {
      acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * xs + i), acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * xs + i + 16), acc[t][1]);
    }
  }
  for (int t = 0; t < TT; ++t) sums[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}
#endif

// sums[t] = weight row wr . activation row t (rows xs floats apart), t < TT.
// Independent FMA chains per activation row: 4 for one row, 2 for two, then one each (the
// rows are the chains): GCC 12's code for more rows with 2 chains each is slower, not faster.
template <int QT, int TT>
static inline void row_dot(const uint8_t *wr, const float *x, long xs, long nb, float *sums) {
#if defined(__AVX512F__)
  if constexpr (has_row_dot16(QT)) return row_dot16<QT, TT>(wr, x, xs, nb, sums);
  if constexpr (QT == CK_F32W && TT >= 3) return row_dot_f32w<TT>((const float *)wr, x, xs, nb, sums);
#endif
  const int A = TT == 1 ? 4 : TT == 2 ? 2 : 1;
  v8 acc[TT][A];
  for (int t = 0; t < TT; ++t)
    for (int a = 0; a < A; ++a) acc[t][a] = v8_zero();
  for (long b = 0; b < nb; ++b) {
    v8 w[4];
    decode_block<QT>(wr, b, w);
    for (int t = 0; t < TT; ++t) {
      const float *xb = x + t * xs + b * kBlock;
      for (int j = 0; j < 4; ++j) acc[t][j % A] = v8_fma(w[j], v8_load(xb + 8 * j), acc[t][j % A]);
    }
  }
  for (int t = 0; t < TT; ++t) {
    v8 s = acc[t][0];
    for (int a = 1; a < A; ++a) s = v8_add(s, acc[t][a]);
    sums[t] = v8_hsum(s);
  }
}
#else
template <int QT>
static inline void decode_block(const uint8_t *row, long b, float *w) {
  if (is_k(QT)) {
    decode_k<QT>(row, b, w);
    return;
  }
  if (is_q5(QT)) {
    decode_q5<QT>(row, b, w);
    return;
  }
  if (QT == CK_E4M3W) {
    for (int i = 0; i < kBlock; ++i) w[i] = kE4M3.v[row[b * kBlock + i]];
    return;
  }
  const uint8_t *p = row + b * block_bytes(QT);
  if (QT == CK_F32W) {
    memcpy(w, p, kBlock * sizeof(float));
    return;
  }
  if (QT == CK_Q8_0 || QT == CK_INT8) {
    const float d = QT == CK_INT8 ? 1.0f : read_half(p);
    const int8_t *q = (const int8_t *)(p + (QT == CK_INT8 ? 0 : 2));
    for (int i = 0; i < kBlock; ++i) w[i] = d * (float)q[i];
    return;
  }
  const float d = read_half(p);
  const uint8_t *q = p + (QT == CK_Q4_1 ? 4 : 2);
  for (int i = 0; i < 16; ++i) {
    if (QT == CK_Q4_0) {
      w[i] = d * (float)((q[i] & 0x0f) - 8);
      w[i + 16] = d * (float)((q[i] >> 4) - 8);
    } else {
      const float m = read_half(p + 2);
      w[i] = d * (float)(q[i] & 0x0f) + m;
      w[i + 16] = d * (float)(q[i] >> 4) + m;
    }
  }
}

template <int QT, int TT>
static inline void row_dot(const uint8_t *wr, const float *x, long xs, long nb, float *sums) {
  float acc[TT][8] = {};
  for (long b = 0; b < nb; ++b) {
    float w[kBlock];
    decode_block<QT>(wr, b, w);
    for (int t = 0; t < TT; ++t)
      for (int i = 0; i < kBlock; ++i) acc[t][i % 8] += w[i] * x[t * xs + b * kBlock + i];
  }
  for (int t = 0; t < TT; ++t) {
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) s += acc[t][i];
    sums[t] = s;
  }
}
#endif

#if defined(CK_V8)
// activation rows x weight rows of the panel kernel's register tile: 4 x 3 = 12 accumulators
// (the fastest of the 12-accumulator shapes, 6 x 2 and 3 x 4 the others; 32 = 8 x 4, no tail)
static const int kPanelX = 4, kPanelW = 3;

// out[t, j..j+RW) for activation rows t0 .. t0 + TX: a TX x RW tile of dot products over
// k with TX * RW accumulators (4 x 3 = 12 registers, + 3 for the weights, 1 for x);
// writes sums[t * RW + r], and zeros up to the next multiple of 8 (sums holds 16).
template <int TX, int RW>
static inline void panel_tile(const float *wp, long k, const float *x, long xs, float *sums) {
  v8 acc[TX][RW];
  for (int t = 0; t < TX; ++t)
    for (int r = 0; r < RW; ++r) acc[t][r] = v8_zero();
  for (long i = 0; i < k; i += 8) {
    v8 w[RW];
    for (int r = 0; r < RW; ++r) w[r] = v8_load(wp + r * k + i);
    for (int t = 0; t < TX; ++t) {
      v8 xv = v8_load(x + t * xs + i);
      v8_keep(xv);  // one load of x per row, in a register
      for (int r = 0; r < RW; ++r) acc[t][r] = v8_fma(xv, w[r], acc[t][r]);
    }
  }
  // sums[t * RW + r] = lane sum of acc[t][r], 8 at a time (zeros pad the last 8)
  const int count = TX * RW, padded = (count + 7) / 8 * 8;
  v8 flat[16];
  for (int i = 0; i < padded; ++i) flat[i] = i < count ? acc[i / RW][i % RW] : v8_zero();
  for (int i = 0; i < padded; i += 8) v8_hsum8x8(flat + i, sums + i);
}

template <int RW>
static inline void panel_rows(const float *wp, long k, const float *x, long xs, long tx, float *sums) {
  switch (tx) {  // tx <= kPanelX = 4
    case 1: panel_tile<1, RW>(wp, k, x, xs, sums); break;
    case 2: panel_tile<2, RW>(wp, k, x, xs, sums); break;
    case 3: panel_tile<3, RW>(wp, k, x, xs, sums); break;
    default: panel_tile<4, RW>(wp, k, x, xs, sums); break;
  }
}

// the format of a row of weights in format qt: an x8 code's row format (the float-scaled codes
// are their own), else qt
static constexpr int row_format(int qt) { return is_x8(qt) && qt <= CK_INT8X8 ? qt - CK_X8 : qt; }

// weight rows j .. j + rw - 1 (format QT, an x8 code read as stored) dequantized into wp
// (rw rows of nb blocks)
template <int QT>
static inline void dequant_rows(const uint8_t *w, long rb, long nb, long j, long rw, float *wp) {
  constexpr bool x8 = is_x8(QT);
  constexpr int RQT = row_format(QT);
  const long k = nb * kBlock;
  for (long r = 0; r < rw; ++r)
    for (long b = 0; b < nb; ++b) {
      v8 v[4];
      if constexpr (x8) {
        uint8_t stored[40];  // the largest block: U8FX8's and S8FX8's
        x8_row_block<RQT>(w, nb, j + r, b, stored);
        decode_block<RQT>(stored, 0, v);
      } else {
        decode_block<QT>(w + (j + r) * rb, b, v);
      }
      for (int q = 0; q < 4; ++q) v8_store(wp + r * k + b * kBlock + 8 * q, v[q]);
    }
}

#include "matvec_amx.h"   // AMX builds: amx_matmul, the tile kernels
#include "matvec_bf16.h"  // AVX512_BF16 builds: gemm_bf16, bfloat16 compute without the tile unit

// Many activation rows (batched decode, prefill): each group of kPanelW weight rows is
// dequantized into an L1 panel of float32, then multiplied into a block of activation
// rows, kPanelX at a time, with a register tile (the FMA:load ratio of a GEMM micro-
// kernel, where row_dot reloads x for every weight row); the block of x stays in L2
// across the weight rows. QT may be an x8 code (CK_ACT16 calls): each row's blocks are then
// gathered from its lane of the groups (blocks.h: x8_row_block) and decoded as stored.
// Returns -1 if the panel buffer could not be had.
template <int QT, typename T>
static int gemm_panel(const uint8_t *w, const float *row_scale, const float *x, long xs,
                      long rows, long n, long k, T *out, const void *bias, int bias_dt,
                      int nthreads) {
  const long rb = row_bytes(row_format(QT), k), nb = k / kBlock, groups = (n + kPanelW - 1) / kPanelW;
  // activation rows a thread runs its weight rows over at a time: ~256 KB of x stays in L2
  long xblock = (256L << 10) / (k * (long)sizeof(float)) / kPanelX * kPanelX;
  xblock = xblock < kPanelX ? kPanelX : xblock;
  int failed = 0;
  parallel_for(groups, row_chunk(groups, nthreads), nthreads, true, [&](long lo, long hi) {
    // float32 weight rows are the panel as they are; others are dequantized into wp
    float *wp = QT == CK_F32W ? NULL : (float *)aligned_alloc(32, kPanelW * k * sizeof(float));
    if (QT != CK_F32W && !wp) {
      __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
      return;
    }
    for (long x0 = 0; x0 < rows; x0 += xblock) {
      const long x1 = rows - x0 < xblock ? rows : x0 + xblock;
      for (long g = lo; g < hi; ++g) {
        const long j = kPanelW * g, rw = n - j < kPanelW ? n - j : kPanelW;
        const float *panel = QT == CK_F32W ? (const float *)(w + j * rb) : wp;
        if (QT != CK_F32W) dequant_rows<QT>(w, rb, nb, j, rw, wp);
        float scale[kPanelW], bj[kPanelW];
        row_params(row_scale, bias, bias_dt, j, rw, scale, bj);
        for (long t0 = x0; t0 < x1; t0 += kPanelX) {
          const long tx = x1 - t0 < kPanelX ? x1 - t0 : kPanelX;
          float sums[16];
          switch (rw) {  // rw <= kPanelW = 3
            case 1: panel_rows<1>(panel, k, x + t0 * xs, xs, tx, sums); break;
            case 2: panel_rows<2>(panel, k, x + t0 * xs, xs, tx, sums); break;
            default: panel_rows<3>(panel, k, x + t0 * xs, xs, tx, sums); break;
          }
          for (long t = 0; t < tx; ++t)
            for (long r = 0; r < rw; ++r)
              from_f32(sums[t * rw + r] * scale[r] + bj[r], &out[(t0 + t) * n + j + r]);
        }
      }
    }
    free(wp);
  });
  return failed ? -1 : 0;
}
#endif

template <int QT, typename T>
static void gemv_rows(const uint8_t *w, const float *row_scale, const float *x, long xs,
                      long rows, long n, long k, T *out, const void *bias,
                      int bias_dt, int nthreads) {
  const long rb = row_bytes(QT, k), nb = k / kBlock, chunk = row_chunk(n, nthreads);
  parallel_for(n, chunk, nthreads, n * k >= (1L << 16), [&](long lo, long hi) {
    for (long x0 = 0; x0 < rows; x0 += kXRows) {  // a block of x stays in L2 across the rows
      const long x1 = rows - x0 < kXRows ? rows : x0 + kXRows;
      for (long j = lo; j < hi; ++j) {
        const uint8_t *wr = w + j * rb;
        const float scale = row_scale ? row_scale[j] : 1.0f;
        const float bj = bias ? load_any(bias, bias_dt, j) : 0.0f;
        float sums[kRows];
        for (long t0 = x0; t0 < x1; t0 += kRows) {
          const long tt = x1 - t0 < kRows ? x1 - t0 : kRows;
          const float *xt = x + t0 * xs;
          switch (tt) {
            case 1: row_dot<QT, 1>(wr, xt, xs, nb, sums); break;
            case 2: row_dot<QT, 2>(wr, xt, xs, nb, sums); break;
            case 3: row_dot<QT, 3>(wr, xt, xs, nb, sums); break;
            case 4: row_dot<QT, 4>(wr, xt, xs, nb, sums); break;
            case 5: row_dot<QT, 5>(wr, xt, xs, nb, sums); break;
            case 6: row_dot<QT, 6>(wr, xt, xs, nb, sums); break;
            case 7: row_dot<QT, 7>(wr, xt, xs, nb, sums); break;
            default: row_dot<QT, 8>(wr, xt, xs, nb, sums); break;
          }
          for (long t = 0; t < tt; ++t) from_f32(sums[t] * scale + bj, &out[(t0 + t) * n + j]);
        }
      }
    }
  });
}

// float32-activation product in format QT: the panel kernel for many rows (x8 codes: always),
// else row_dot
template <int QT, typename T>
static int matmul_float_act(const uint8_t *w, const float *rs, const float *x, long xs, long rows,
                            long n, long k, T *out, const void *bias, int bias_dt, int nt) {
#if defined(CK_V8)
  if (is_x8(QT) || rows >= kPanelMin) return gemm_panel<QT, T>(w, rs, x, xs, rows, n, k, out, bias, bias_dt, nt);
#endif
  if constexpr (!is_x8(QT)) gemv_rows<QT, T>(w, rs, x, xs, rows, n, k, out, bias, bias_dt, nt);
  return 0;
}

// The product on activations x of the compute dtype T: the tile kernels take them as they are
// (AMX builds, from kAmxMinRows rows), so does gemm_bf16 (AVX512_BF16 builds, bfloat16 from
// kBf16MinRows rows); the others take float32 ones, so bfloat16 rows are widened into a copy
// first. Returns -1 if a buffer could not be had.
template <int QT, typename T>
static int matmul_act(const uint8_t *w, const float *rs, const T *x, long xs, long rows, long n,
                      long k, T *out, const void *bias, int bias_dt, int nt) {
#if defined(__AMX_BF16__)
  if (rows >= kAmxMinRows && k % 32 == 0 && amx_ready())
    return amx_matmul<QT, T>(w, rs, x, xs, rows, n, k, out, bias, bias_dt, nt);
#endif
#if defined(__AVX512BF16__)
  if constexpr (std::is_same<T, bf16_t>::value)
    if (rows >= kBf16MinRows) return gemm_bf16<QT>(w, rs, x, xs, rows, n, k, out, bias, bias_dt, nt);
#endif
  if constexpr (std::is_same<T, float>::value) {
    return matmul_float_act<QT, T>(w, rs, x, xs, rows, n, k, out, bias, bias_dt, nt);
  } else {
    float *xf = (float *)malloc(rows * k * sizeof(float));
    if (!xf) return -1;
    parallel_for(rows, 16, nt, rows * k >= (1L << 16), [&](long lo, long hi) {
      for (long r = lo; r < hi; ++r)
        for (long i = 0; i < k; ++i) xf[r * k + i] = to_f32(x[r * xs + i]);
    });
    const int status = matmul_float_act<QT, T>(w, rs, xf, k, rows, n, k, out, bias, bias_dt, nt);
    free(xf);
    return status;
  }
}

template <typename T>
static int gemv_typed(int qt, const uint8_t *w, const float *rs, const T *x, long xs,
                      long rows, long n, long k, void *out, const void *bias, int bias_dt, int nt) {
  T *o = (T *)out;
#define CK_CASE(Q) \
  case Q: return matmul_act<Q, T>(w, rs, x, xs, rows, n, k, o, bias, bias_dt, nt);
  switch (qt) {
    CK_CASE(CK_Q8_0) CK_CASE(CK_Q4_0) CK_CASE(CK_Q4_1) CK_CASE(CK_F32W) CK_CASE(CK_Q4_K)
    CK_CASE(CK_Q5_K) CK_CASE(CK_Q6_K) CK_CASE(CK_Q5_0) CK_CASE(CK_Q5_1) CK_CASE(CK_E4M3W)
#if defined(CK_V8)  // x8 weights (CK_ACT16), from kPanelMin rows: the panel (or tile) kernel only
    CK_CASE(CK_Q8_0X8) CK_CASE(CK_Q4_0X8) CK_CASE(CK_Q4_1X8) CK_CASE(CK_INT8X8) CK_CASE(CK_Q4FX8)
    CK_CASE(CK_U8FX8) CK_CASE(CK_S8FX8)
#endif
    default: return matmul_act<CK_INT8, T>(w, rs, x, xs, rows, n, k, o, bias, bias_dt, nt);
  }
#undef CK_CASE
}

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// out[rows, n] (dtype, contiguous) = x[rows, k] (dtype, row stride x_stride) @ W^T
// (+ bias), float32 accumulation (on float32 activations; bfloat16 ones the tile kernels take
// as they are, the others widened). W: n rows in format qt;
// row_scale: per-row scales for CK_INT8, else NULL. k must be a multiple of 32 (of 256
// for the K-quants).
// qt CK_F32W: W is a plain row-major float32 matrix.
// qt an x8 code (CK_ACT16 calls from kPanelMin rows, SIMD builds only): W in the x8 layout
// (quant.cpp).
// Returns 0, or -1 if a buffer could not be had (a float32 copy of bfloat16 activations, a
// kernel's scratch).
int CK_FN(dequant_matmul)(int qt, const void *w, const float *row_scale, long n, long k,
                            int dtype, const void *x, long x_stride, long rows, void *out,
                            const void *bias, int bias_dtype, int nthreads) {
  const uint8_t *wb = (const uint8_t *)w;
  if (dtype == CK_F32)
    return gemv_typed<float>(qt, wb, row_scale, (const float *)x, x_stride, rows, n, k, out, bias,
                             bias_dtype, nthreads);
  return gemv_typed<bf16_t>(qt, wb, row_scale, (const bf16_t *)x, x_stride, rows, n, k, out, bias,
                            bias_dtype, nthreads);
}

}  // extern "C"
