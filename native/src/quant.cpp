// Quantized linear with int8 activations (CPU_QUANT_ACTIVATIONS), any batch:
// y[T, N] = x[T, K] @ W[N, K]^T + b, with the activation rows rounded to int8 per block of
// 32 (scale d, and s = d * sum(q) for the weight offsets), as llama.cpp does; or, the default
// path (CK_ACT16), rounded to int16 per block of 32 and multiplied as two int8 rows
// (quantize_rows16).
//
// The weights are repacked at load (linear.py: interleave_x8) into groups of 8 rows
// ("x8"): for each block of 32 columns, the 8 rows' scales side by side, then the
// quantized values 4 bytes of a row at a time, row after row. A 256-bit register then holds 4 consecutive weights
// of each of the 8 rows, so one u8 x s8 multiply-add (maddubs, or vpdpbusd with
// AVX512-VNNI) against 4 activation bytes broadcast to all lanes leaves 8 rows' partial
// dot products in 8 lanes: no horizontal sums, and the block scales are applied to 8 rows
// with one multiply. Against a row-at-a-time dot product this is ~2.5x fewer instructions
// a weight.
// On aarch64 with the dot-product extension, sdot does the same in two 128-bit halves
// (rows 0-3, 4-7); other ISA paths (s390x, NEON without dotprod, scalar) take the
// portable group_dot below.
//
// Layout of group g, block b, at (g * nb + b) * 8 * block_bytes(base format):
//   Q4_1: d[8] f16, m[8] f16, then chunk c = 0..3 of each row r: bytes 4c..4c+3 of its
//         16 nibble bytes (low nibbles: elements 4c..4c+3, high: 16+4c..16+4c+3)
//   Q4_0: d[8] f16, then as Q4_1;  Q8_0: d[8] f16, then chunks c = 0..7 (elements 4c..4c+3)
//   INT8: chunks c = 0..7 (per-row float32 scales kept apart, padded to whole groups)
//   Q4FX8: d[8] f32, m[8] f32, then as Q4_1;  U8FX8: d[8] f32, m[8] f32, then as Q8_0 (codes
//   0..63: a vpmaddubsw pair stays below 2^15);  S8FX8: d0[8] f32, d1[8] f32, then as Q8_0
// Rows past n in the last group are zeros and never written out.
#include <limits.h>
#include <stdlib.h>

#include <type_traits>

#include "blocks.h"
#include "kernels.h"
#include "simd.h"

namespace CK_NS {

static const int kGroup = 8;     // weight rows interleaved together (one per 32-bit lane)
// activation rows sharing one decode of a weight block: 8 where 32 vector registers hold their
// accumulators (AVX-512VL), else 4 (AVX2's 16 registers spill at 8)
#if defined(__AVX512VL__)
static const int kTile = 8;
#else
static const int kTile = 4;
#endif
// CK_ACT16 calls of this many activation rows or more run the float32 panel kernel instead
// (matvec.cpp). AVX-512VL builds: never (int16 outruns the panel at any row count); other
// builds from kPanelMin (without VNNI the panel is the faster from there on byte codes), and
// AVX2 builds on 4-bit codes from kAct16PanelMinQ4: there vpmaddubsw sums a nibble block in 16
// bits, and int16 outruns the panel up to 64 rows (Zen 4, AVX2 build, one thread, 3072x576
// Q4_0/Q4_1: 7 rows 1.5x, 16 rows 1.2x, 64 rows 1.05x; Q8_0: 0.97x at 7 rows, 0.77x at 16).
#if defined(__AMX_BF16__)
static const long kAct16PanelMin = kAmxMinRows;  // AMX builds: the panel path's tile kernel
#elif defined(__AVX512VL__)
static const long kAct16PanelMin = LONG_MAX;
#else
static const long kAct16PanelMin = kPanelMin;
#endif
#if defined(__AVX2__) && !defined(__AVX512VL__)
static const long kAct16PanelMinQ4 = 64;
#else
static const long kAct16PanelMinQ4 = kAct16PanelMin;
#endif
// whether a CK_ACT16 call on x8 format qt of this many rows of activations in dtype runs the
// panel path instead (AMX builds: its tile kernel, where the process may use the tiles;
// AVX512_BF16 builds: bfloat16 rows from kBf16MinRows on gemm_bf16, matvec_bf16.h, whose weights
// are packed once for all rows)
static inline bool act16_on_panel(int qt, long rows, int dtype) {
#if defined(__AVX512BF16__)
  if (dtype == CK_BF16 && rows >= kBf16MinRows) return true;
#endif
  const bool q4 = qt == CK_Q4_0X8 || qt == CK_Q4_1X8 || qt == CK_Q4FX8;
  const long from = q4 ? kAct16PanelMinQ4 : kAct16PanelMin;
#if defined(__AMX_BF16__)
  return rows >= from && amx_ready();
#else
  return rows >= from;
#endif
}
static const long kXBlock = 64;  // activation rows a thread runs its weight groups over at a time
// bytes ahead of a group's blocks to prefetch: the hardware prefetcher alone left a
// batch-1 product well below the rate the memory gives one thread
static const long kPrefetchAhead = 4096;
// activation rows from which the 512-bit path takes two weight groups at a time (take_pairs)
static const long kPairMinRows = 3;
// int8 activation rows up to which a product streams its weights (one activation row: 1 int8 row
// or an int16 row's 2): each thread then takes one run of whole groups, its stream jumping once a
// call, not every few groups (each jump starts the prefetch over; batch-1 decode's small linears
// streamed at about half the rate of the lm_head's long runs)
static const long kStreamRows = 2;

// int8 activations: q [T, K], d and s [T, K/32]
struct QAct {
  int8_t *q;
  float *d, *s;
  long nb;
};

#include "quantize_simd.h"  // block_amax, block_codes8, block_codes16: float32 rows on AVX2 and up

// max |x| over the block of 32 at xb
template <typename T>
static inline float block_amax_of(const T *xb) {
#if defined(CK_QUANTIZE_SIMD)
  if constexpr (std::is_same<T, float>::value) return block_amax(xb);
#endif
  float amax = 0.0f;
#pragma omp simd reduction(max : amax)
  for (int i = 0; i < kBlock; ++i) amax = fmax_(amax, __builtin_fabsf(to_f32(xb[i])));
  return amax;
}

// qb = xb * id rounded half away from zero, clamped to +-127; returns the codes' sum
template <typename T>
static inline int block_codes8_of(const T *xb, float id, int8_t *qb) {
#if defined(CK_QUANTIZE_SIMD)
  if constexpr (std::is_same<T, float>::value) return block_codes8(xb, id, qb);
#endif
  int sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < kBlock; ++i) {
    float v = to_f32(xb[i]) * id;
    int qi = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
    qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
    qb[i] = (int8_t)qi;
    sum += qi;
  }
  return sum;
}

// v = xb * id rounded, clamped to +-32512, written as 255 h + l (h to qh, l to ql); *sh, *sl their sums
template <typename T>
static inline void block_codes16_of(const T *xb, float id, int8_t *qh, int8_t *ql, int *sh, int *sl) {
#if defined(CK_QUANTIZE_SIMD)
  if constexpr (std::is_same<T, float>::value) return block_codes16(xb, id, qh, ql, sh, sl);
#endif
  int hs = 0, ls = 0;
#pragma omp simd reduction(+ : hs, ls)
  for (int i = 0; i < kBlock; ++i) {
    const float v = to_f32(xb[i]) * id;
    int vi = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
    vi = vi > 32512 ? 32512 : vi < -32512 ? -32512 : vi;
    const float hf = (float)vi * (1.0f / 255.0f);  // never within 2^-9 of a tie: |l| <= 127
    const int h = (int)(hf + (hf >= 0.0f ? 0.5f : -0.5f)), l = vi - 255 * h;
    qh[i] = (int8_t)h;
    ql[i] = (int8_t)l;
    hs += h;
    ls += l;
  }
  *sh = hs;
  *sl = ls;
}

// per_row: one scale for the whole row, written to each of its blocks: compressed-tensors'
// dynamic per-token int8 (W8A8), whose scale is max|x| / 127.5 (codes clamped to +-127 here:
// the extreme element it would round to -128 or 128 loses half a level); else one scale
// max|x| / 127 per block of 32
template <typename T>
static void quantize_rows(const T *x, long x_stride, long rows, long k, QAct a, bool per_row,
                          int nthreads) {
  parallel_for(rows, 16, nthreads, rows * k >= (1L << 16), [&](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      float row_amax = 0.0f;
      if (per_row)
#pragma omp simd reduction(max : row_amax)
        for (long i = 0; i < k; ++i) row_amax = fmax_(row_amax, __builtin_fabsf(to_f32(x[r * x_stride + i])));
      for (long b = 0; b < a.nb; ++b) {
        const T *xb = x + r * x_stride + b * kBlock;
        int8_t *qb = a.q + r * k + b * kBlock;
        const float amax = per_row ? row_amax : block_amax_of(xb);
        const float levels = per_row ? 127.5f : 127.0f;
        const float d = amax / levels, id = amax > 0.0f ? levels / amax : 0.0f;
        const int sum = block_codes8_of(xb, id, qb);
        a.d[r * a.nb + b] = d;
        a.s[r * a.nb + b] = d * (float)sum;
      }
    }
  });
}

// CK_ACT16: activations rounded to int16 per block of 32, v = round(x / d) with
// d = max|x| / 32512 (x to 2^-16 of its block's largest magnitude), and written as two int8
// rows, v = 255 h + l with |h|, |l| <= 127: row 2r holds h with scale 255 d, row 2r + 1 holds
// l with scale d. The x8 kernel's products with the two rows, summed, are then its product
// with v d (int8 codes and sums as the kernel takes them: no second kernel per ISA).
template <typename T>
static void quantize_rows16(const T *x, long x_stride, long rows, long k, QAct a, int nthreads) {
  parallel_for(rows, 16, nthreads, rows * k >= (1L << 16), [&](long lo, long hi) {
    for (long r = lo; r < hi; ++r)
      for (long b = 0; b < a.nb; ++b) {
        const T *xb = x + r * x_stride + b * kBlock;
        int8_t *qh = a.q + 2 * r * k + b * kBlock, *ql = qh + k;
        const float amax = block_amax_of(xb);
        const float levels = 32512.0f;  // 127 * 256
        const float d = amax / levels, id = amax > 0.0f ? levels / amax : 0.0f;
        int sh, sl;
        block_codes16_of(xb, id, qh, ql, &sh, &sl);
        const long hb = 2 * r * a.nb + b, lb = hb + a.nb;
        a.d[hb] = 255.0f * d;
        a.s[hb] = 255.0f * d * (float)sh;
        a.d[lb] = d;
        a.s[lb] = d * (float)sl;
      }
  });
}

// what an x8 format (QT: a row format's code, or one of the float-scaled x8 codes) holds
template <int QT>  // float32 scales (the K-quants' and Q5 formats' blocks, blocks.h)
static constexpr bool f32_scales() { return QT >= CK_Q4FX8; }
// bytes of a group block's scales: 8 f16 d (and 8 f16 m for Q4_1), or 8 + 8 f32
template <int QT>
static constexpr int scale_bytes() {
  return QT == CK_INT8 ? 0 : f32_scales<QT>() ? 64 : QT == CK_Q4_1 ? 32 : 16;
}
template <int QT>  // 4-bit codes, 16 bytes a row's block, else one byte a value
static constexpr bool is_q4() { return QT == CK_Q4_0 || QT == CK_Q4_1 || QT == CK_Q4FX8; }
template <int QT>  // value d * q + m: the activation block's sum s multiplies m
static constexpr bool has_min() { return is_q4<QT>() || QT == CK_U8FX8; }
template <int QT>  // signed byte codes (else unsigned)
static constexpr bool signed_codes() { return QT == CK_Q8_0 || QT == CK_INT8 || QT == CK_S8FX8; }
template <int QT>  // a scale for values 0-15 and one for 16-31
static constexpr bool half_scales() { return QT == CK_S8FX8; }

#if defined(__AVX2__)
#define CK_GROUP_SIMD 1
static inline __m256i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// signed byte codes fed to vpdpbusd as q + 128 (one xor for all the activation rows instead
// of a sign flip per row), the 128 taken back with the activation sums as a min of -128 d;
// not without VNNI: vpmaddubsw would saturate 2 x 255 x 127
template <int QT>
static constexpr bool offset_codes() {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return signed_codes<QT>() && !half_scales<QT>();
#else
  return false;
#endif
}

// s += the 4-byte dot products of unsigned u with signed s8 in each 32-bit lane
static inline __m256i dot4_add(__m256i s, __m256i u, __m256i s8) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(s, u, s8);
#else
  return _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s8), _mm256_set1_epi16(1)));
#endif
}

// independent vpdpbusd chains a row sums a block in: a block's 8 dot products into one register
// are a chain of 8 x 4 cycles (Zen 4) that the out-of-order window hides only partly behind one
// or two rows' work (Zen 4, one thread, 3072x576 Q4_0 in L2: one int16 row 1.07x, one int8 row
// 1.06x with 2 and 4 chains)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
template <int TT>
static constexpr int chains() { return TT == 1 ? 4 : TT == 2 ? 2 : 1; }
#else
template <int TT>
static constexpr int chains() { return 1; }
#endif

// acc[t] (8 rows in 8 lanes) += group block p . activation block b of rows t0 + t
template <int QT, int TT>
__attribute__((always_inline)) static inline void group_block(const uint8_t *p, const QAct &a,
                                                              long t0, long k, long b,
                                                              v8 *acc) {
  const uint8_t *q = p + scale_bytes<QT>();
  const int8_t *aq[TT];
  for (int t = 0; t < TT; ++t) aq[t] = a.q + (t0 + t) * k + b * kBlock;
  constexpr int A = half_scales<QT>() ? 1 : chains<TT>();  // (half-scaled blocks: a sum a half)
  __m256i part[TT][A];  // part[t][0]: row t's block sum once the chains are added
  for (int t = 0; t < TT; ++t)
    for (int j = 0; j < A; ++j) part[t][j] = _mm256_setzero_si256();
  if (is_q4<QT>()) {
    // a 16-bit lane sums 8 vpmaddubsw results of at most 2 * 15 * 127: below 2^15, so the
    // block is summed in 16 bits and widened once
    const __m256i mask = _mm256_set1_epi8(0x0f);
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
    __m256i s16[TT];
    for (int t = 0; t < TT; ++t) s16[t] = _mm256_setzero_si256();
#endif
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
      const __m256i lo = _mm256_and_si256(v, mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      for (int t = 0; t < TT; ++t) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        part[t][(2 * c) % A] = _mm256_dpbusd_epi32(part[t][(2 * c) % A], lo, bcast4(aq[t] + 4 * c));
        part[t][(2 * c + 1) % A] = _mm256_dpbusd_epi32(part[t][(2 * c + 1) % A], hi, bcast4(aq[t] + 16 + 4 * c));
#else
        s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(lo, bcast4(aq[t] + 4 * c)));
        s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(hi, bcast4(aq[t] + 16 + 4 * c)));
        // keep the sum in its register: GCC otherwise computes every product of the block
        // first and spills them all to the stack
        __asm__("" : "+x"(s16[t]));
#endif
      }
    }
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
    for (int t = 0; t < TT; ++t) part[t][0] = _mm256_madd_epi16(s16[t], _mm256_set1_epi16(1));
#endif
  } else {  // byte codes; signed ones as |w| x (a with w's sign), the u8 x s8 form of w x a
    __m256i lo32[TT];  // values 0-15 of half-scaled blocks
    for (int c = 0; c < 8; ++c) {
      if (half_scales<QT>() && c == 4)
        for (int t = 0; t < TT; ++t) lo32[t] = part[t][0], part[t][0] = _mm256_setzero_si256();
      const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
      const bool flip = signed_codes<QT>() && !offset_codes<QT>();
      const __m256i u = offset_codes<QT>() ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80))
                        : flip             ? _mm256_sign_epi8(v, v)
                                           : v;
      for (int t = 0; t < TT; ++t) {
        const __m256i av = bcast4(aq[t] + 4 * c);
        part[t][c % A] = dot4_add(part[t][c % A], u, flip ? _mm256_sign_epi8(av, v) : av);
        __asm__("" : "+x"(part[t][c % A]));  // (as above)
      }
    }
    if (half_scales<QT>()) {  // second scale in m's place: d0 * lo + d1 * hi
      const __m256 d0 = _mm256_loadu_ps((const float *)p), d1 = _mm256_loadu_ps((const float *)p + 8);
      for (int t = 0; t < TT; ++t) {
        const __m256 ad = _mm256_set1_ps(a.d[(t0 + t) * a.nb + b]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo32[t]), _mm256_mul_ps(d0, ad), acc[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[t][0]), _mm256_mul_ps(d1, ad), acc[t]);
      }
      return;
    }
  }
  for (int t = 0; t < TT; ++t) {
    if (A == 4) part[t][2] = _mm256_add_epi32(part[t][2], part[t][3]);
    if (A >= 2) part[t][0] = _mm256_add_epi32(part[t][0], part[t][1]);
    if (A == 4) part[t][0] = _mm256_add_epi32(part[t][0], part[t][2]);
  }
  __m256 d, m = _mm256_setzero_ps();
  if (QT == CK_INT8) {
    d = _mm256_set1_ps(1.0f);
  } else if (f32_scales<QT>()) {
    d = _mm256_loadu_ps((const float *)p);
    m = _mm256_loadu_ps((const float *)p + 8);
  } else {
    d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  }
  if (QT == CK_Q4_1) m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
  if (QT == CK_Q4_0) m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));  // d * (q - 8)
  if (offset_codes<QT>()) m = _mm256_mul_ps(d, _mm256_set1_ps(-128.0f));  // d * ((q + 128) - 128)
  for (int t = 0; t < TT; ++t) {
    const long ai = (t0 + t) * a.nb + b;
    const __m256 dot = _mm256_cvtepi32_ps(part[t][0]);
    acc[t] = _mm256_fmadd_ps(dot, _mm256_mul_ps(d, _mm256_set1_ps(a.d[ai])), acc[t]);
    if (has_min<QT>() || offset_codes<QT>()) acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.s[ai]), acc[t]);
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
// Two groups at once (16 weight rows: group g's 8 in the low 256 bits, g + 1's in the high)
// in 512-bit registers: half the instructions a weight of group_block, each activation
// broadcast shared by both groups: faster where 512-bit units run at full rate (Intel Xeon);
// not measured on Zen 4, which runs each 512-bit operation as two halves. Every x8 format but
// the half-scaled one (no 512-bit vpsignb: S8FX8 stays on group_block).
#define CK_PAIR_SIMD 1
template <int QT>
static constexpr bool pair_format() { return !half_scales<QT>(); }

static inline __m512i load_pair(const uint8_t *p0, const uint8_t *p1) {
  return _mm512_inserti64x4(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p0)),
                            _mm256_loadu_si256((const __m256i *)p1), 1);
}
static inline __m512 load_pair_f16(const uint8_t *p0, const uint8_t *p1) {
  const __m128i h0 = _mm_loadu_si128((const __m128i *)p0), h1 = _mm_loadu_si128((const __m128i *)p1);
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_broadcastsi128_si256(h0), h1, 1));
}
static inline __m512i bcast4x16(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// acc[t] (16 rows in 16 lanes) += group blocks p0, p1 . activation block b of rows t0 + t
// (group_block's arithmetic, two groups wide)
template <int QT, int TT>
__attribute__((always_inline)) static inline void pair_block(const uint8_t *p0, const uint8_t *p1,
                                                             const QAct &a, long t0, long k, long b,
                                                             __m512 *acc) {
  const uint8_t *q0 = p0 + scale_bytes<QT>(), *q1 = p1 + scale_bytes<QT>();
  const int8_t *aq[TT];
  __m512i s32[TT];
  for (int t = 0; t < TT; ++t) {
    aq[t] = a.q + (t0 + t) * k + b * kBlock;
    s32[t] = _mm512_setzero_si512();
  }
  if (is_q4<QT>()) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m512i v = load_pair(q0 + 32 * c, q1 + 32 * c);
      const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      for (int t = 0; t < TT; ++t) {
        s32[t] = _mm512_dpbusd_epi32(s32[t], lo, bcast4x16(aq[t] + 4 * c));
        s32[t] = _mm512_dpbusd_epi32(s32[t], hi, bcast4x16(aq[t] + 16 + 4 * c));
      }
    }
  } else {  // byte codes: unsigned, or signed ones offset by 128 (offset_codes)
    for (int c = 0; c < 8; ++c) {
      const __m512i v = load_pair(q0 + 32 * c, q1 + 32 * c);
      const __m512i u = offset_codes<QT>() ? _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)) : v;
      for (int t = 0; t < TT; ++t) s32[t] = _mm512_dpbusd_epi32(s32[t], u, bcast4x16(aq[t] + 4 * c));
    }
  }
  __m512 d, m = _mm512_setzero_ps();
  if (QT == CK_INT8) {
    d = _mm512_set1_ps(1.0f);
  } else if (f32_scales<QT>()) {
    d = _mm512_castsi512_ps(load_pair(p0, p1));
    m = _mm512_castsi512_ps(load_pair(p0 + 32, p1 + 32));
  } else {
    d = load_pair_f16(p0, p1);
  }
  if (QT == CK_Q4_1) m = load_pair_f16(p0 + 16, p1 + 16);
  if (QT == CK_Q4_0) m = _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
  if (offset_codes<QT>()) m = _mm512_mul_ps(d, _mm512_set1_ps(-128.0f));
  for (int t = 0; t < TT; ++t) {
    const long ai = (t0 + t) * a.nb + b;
    const __m512 dot = _mm512_cvtepi32_ps(s32[t]);
    acc[t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(a.d[ai])), acc[t]);
    if (has_min<QT>() || offset_codes<QT>()) acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.s[ai]), acc[t]);
  }
}
#endif

#elif defined(__ARM_FEATURE_DOTPROD) && !defined(CK_NO_SIMD)
#define CK_GROUP_SIMD 1
static inline int8x16_t bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

// acc[t] (8 rows in 8 lanes) += group block p . activation block b of rows t0 + t: sdot
// adds the 4-byte dot products of each 32-bit lane (rows 0-3 in s0, 4-7 in s1). Signed x
// signed, so the nibbles (0..15) and the int8 weights go in as they are.
template <int QT, int TT>
__attribute__((always_inline)) static inline void group_block(const uint8_t *p, const QAct &a,
                                                              long t0, long k, long b,
                                                              v8 *acc) {
  const uint8_t *q = p + scale_bytes<QT>();
  const int8_t *aq[TT];
  for (int t = 0; t < TT; ++t) aq[t] = a.q + (t0 + t) * k + b * kBlock;
  int32x4_t s0[TT], s1[TT];
  for (int t = 0; t < TT; ++t) s0[t] = s1[t] = vdupq_n_s32(0);
  if (is_q4<QT>()) {
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const uint8x16_t v0 = vld1q_u8(q + 32 * c), v1 = vld1q_u8(q + 32 * c + 16);
      const int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(v0, mask)), hi0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4));
      const int8x16_t lo1 = vreinterpretq_s8_u8(vandq_u8(v1, mask)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
      for (int t = 0; t < TT; ++t) {
        const int8x16_t al = bcast4(aq[t] + 4 * c), ah = bcast4(aq[t] + 16 + 4 * c);
        s0[t] = vdotq_s32(vdotq_s32(s0[t], lo0, al), hi0, ah);
        s1[t] = vdotq_s32(vdotq_s32(s1[t], lo1, al), hi1, ah);
      }
    }
  } else {  // byte codes (the unsigned ones are 0..63: as signed bytes the same)
    int32x4_t lo0[TT], lo1[TT];  // values 0-15 of half-scaled blocks
    for (int c = 0; c < 8; ++c) {
      if (half_scales<QT>() && c == 4)
        for (int t = 0; t < TT; ++t) lo0[t] = s0[t], lo1[t] = s1[t], s0[t] = s1[t] = vdupq_n_s32(0);
      const int8x16_t w0 = vld1q_s8((const int8_t *)q + 32 * c), w1 = vld1q_s8((const int8_t *)q + 32 * c + 16);
      for (int t = 0; t < TT; ++t) {
        const int8x16_t av = bcast4(aq[t] + 4 * c);
        s0[t] = vdotq_s32(s0[t], w0, av);
        s1[t] = vdotq_s32(s1[t], w1, av);
      }
    }
    if (half_scales<QT>()) {  // second scale in m's place: d0 * lo + d1 * hi
      const v8 d0 = v8_load((const float *)p), d1 = v8_load((const float *)p + 8);
      for (int t = 0; t < TT; ++t) {
        const v8 ad = v8_set1(a.d[(t0 + t) * a.nb + b]);
        acc[t] = v8_fma(v8{vcvtq_f32_s32(lo0[t]), vcvtq_f32_s32(lo1[t])}, v8_mul(d0, ad), acc[t]);
        acc[t] = v8_fma(v8{vcvtq_f32_s32(s0[t]), vcvtq_f32_s32(s1[t])}, v8_mul(d1, ad), acc[t]);
      }
      return;
    }
  }
  const float16_t *h = (const float16_t *)p;
  v8 d, m = v8_zero();
  if (QT == CK_INT8) {
    d = v8_set1(1.0f);
  } else if (f32_scales<QT>()) {
    d = v8_load((const float *)p);
    m = v8_load((const float *)p + 8);
  } else {
    d = v8{vcvt_f32_f16(vld1_f16(h)), vcvt_f32_f16(vld1_f16(h + 4))};
  }
  if (QT == CK_Q4_1) m = v8{vcvt_f32_f16(vld1_f16(h + 8)), vcvt_f32_f16(vld1_f16(h + 12))};
  if (QT == CK_Q4_0) m = v8_mul(d, v8_set1(-8.0f));  // d * (q - 8)
  for (int t = 0; t < TT; ++t) {
    const long ai = (t0 + t) * a.nb + b;
    const v8 dot = {vcvtq_f32_s32(s0[t]), vcvtq_f32_s32(s1[t])};
    acc[t] = v8_fma(dot, v8_mul(d, v8_set1(a.d[ai])), acc[t]);
    if (has_min<QT>()) acc[t] = v8_fma(m, v8_set1(a.s[ai]), acc[t]);
  }
}
#endif

#if defined(CK_GROUP_SIMD)
// sums[t * 8 + r] = weight row r of the group at wg . activation row t0 + t, for t < TT.
// One group at a time: two groups against one activation row (sharing its loads) stream
// slower from memory (two streams 2.6 KB apart defeat the prefetcher).
template <int QT, int TT>
static inline void group_dot(const uint8_t *wg, const QAct &a, long t0, long k, float *sums) {
  v8 acc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = v8_zero();
  const long gb = kGroup * block_bytes(QT);
  for (long b = 0; b < a.nb; ++b) {
    const uint8_t *p = wg + b * gb;
    for (long l = 0; l < gb; l += 64) __builtin_prefetch(p + kPrefetchAhead + l);
    group_block<QT, TT>(p, a, t0, k, b, acc);
  }
  for (int t = 0; t < TT; ++t) v8_store(sums + t * kGroup, acc[t]);
}
#if defined(CK_PAIR_SIMD)
// sums[t * 16 + r] = weight row r of groups wg, wg + gbytes (rows 8-15) . activation row
// t0 + t, for t < TT
template <int QT, int TT>
static inline void pair_dot(const uint8_t *wg, long gbytes, const QAct &a, long t0, long k, float *sums) {
  __m512 acc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = _mm512_setzero_ps();
  const long gb = kGroup * block_bytes(QT);
  for (long b = 0; b < a.nb; ++b) {
    const uint8_t *p = wg + b * gb;
    for (long l = 0; l < gb; l += 64) {
      __builtin_prefetch(p + kPrefetchAhead + l);
      __builtin_prefetch(p + gbytes + kPrefetchAhead + l);
    }
    pair_block<QT, TT>(p, p + gbytes, a, t0, k, b, acc);
  }
  for (int t = 0; t < TT; ++t) _mm512_storeu_ps(sums + t * 2 * kGroup, acc[t]);
}
#endif
#else
// the quantized value of row r, element i of a group block p (x8 layout)
template <int QT>
static inline int x8_value(const uint8_t *p, int r, int i) {
  const uint8_t *q = p + scale_bytes<QT>();
  if (!is_q4<QT>()) {
    const uint8_t byte = q[(i / 4) * 32 + r * 4 + i % 4];
    return signed_codes<QT>() ? (int)(int8_t)byte : (int)byte;
  }
  const int j = i % 16;  // nibble byte j: element j low, j + 16 high
  const uint8_t byte = q[(j / 4) * 32 + r * 4 + j % 4];
  return i < 16 ? byte & 0x0f : byte >> 4;
}

template <int QT, int TT>  // (as above)
static inline void group_dot(const uint8_t *wg, const QAct &a, long t0, long k, float *sums) {
  const long gb = kGroup * block_bytes(QT);
  for (int i = 0; i < TT * kGroup; ++i) sums[i] = 0.0f;
  for (long b = 0; b < a.nb; ++b) {
    const uint8_t *p = wg + b * gb;
    for (int r = 0; r < kGroup; ++r) {
      float d = 1.0f, m = 0.0f;  // (d1 = m: the second scale of half-scaled blocks)
      if (f32_scales<QT>()) {
        memcpy(&d, p + 4 * r, 4);
        memcpy(&m, p + 32 + 4 * r, 4);
      } else if (QT != CK_INT8) {
        d = read_half(p + 2 * r);
        m = QT == CK_Q4_1 ? read_half(p + 16 + 2 * r) : QT == CK_Q4_0 ? -8.0f * d : 0.0f;
      }
      for (int t = 0; t < TT; ++t) {
        const long ai = (t0 + t) * a.nb + b;
        const int8_t *aq = a.q + (t0 + t) * k + b * kBlock;
        int lo = 0, hi = 0;
        for (int i = 0; i < kBlock; ++i) (i < 16 ? lo : hi) += x8_value<QT>(p, r, i) * (int)aq[i];
        sums[t * kGroup + r] +=
            half_scales<QT>() ? ((float)lo * d + (float)hi * m) * a.d[ai]
                              : (float)(lo + hi) * d * a.d[ai] + (has_min<QT>() ? m * a.s[ai] : 0.0f);
      }
    }
  }
}
#endif

// whether matmul_x8 on format QT takes two groups at a time (pair_dot) from `rows` activation
// rows: not at batch 1 (act16: 2 rows), where a product streams its weights from memory and
// two streams a group apart defeat the prefetcher (group_dot)
template <int QT>
static inline bool take_pairs(long rows) {
#if defined(CK_PAIR_SIMD)
  return pair_format<QT>() && rows >= kPairMinRows;
#else
  (void)rows;
  return false;
#endif
}

// sums[t * 8 * ng + r] (r < 8 * ng) for the ng (1 or 2) groups at wg and activation rows t0 .. t0 + tt - 1
template <int QT>
static inline void groups_dot(int ng, const uint8_t *wg, long gbytes, const QAct &a, long t0, long tt,
                              long k, float *sums) {
#if defined(CK_PAIR_SIMD)
  if constexpr (pair_format<QT>()) {  // ng is 2 only for these formats (take_pairs)
    if (ng == 2) {
      switch (tt) {
        case 1: return pair_dot<QT, 1>(wg, gbytes, a, t0, k, sums);
        case 2: return pair_dot<QT, 2>(wg, gbytes, a, t0, k, sums);
        case 3: return pair_dot<QT, 3>(wg, gbytes, a, t0, k, sums);
        case 4: return pair_dot<QT, 4>(wg, gbytes, a, t0, k, sums);
        case 5: return pair_dot<QT, 5>(wg, gbytes, a, t0, k, sums);
        case 6: return pair_dot<QT, 6>(wg, gbytes, a, t0, k, sums);
        case 7: return pair_dot<QT, 7>(wg, gbytes, a, t0, k, sums);
        default: return pair_dot<QT, 8>(wg, gbytes, a, t0, k, sums);
      }
    }
  }
#endif
  (void)ng, (void)gbytes;
  switch (tt) {
    case 1: return group_dot<QT, 1>(wg, a, t0, k, sums);
    case 2: return group_dot<QT, 2>(wg, a, t0, k, sums);
    case 3: return group_dot<QT, 3>(wg, a, t0, k, sums);
    case 4: return group_dot<QT, 4>(wg, a, t0, k, sums);
    case 5: return group_dot<QT, 5>(wg, a, t0, k, sums);
    case 6: return group_dot<QT, 6>(wg, a, t0, k, sums);
    case 7: return group_dot<QT, 7>(wg, a, t0, k, sums);
    default: return group_dot<QT, 8>(wg, a, t0, k, sums);
  }
}

// out[rows / split, n]: split 2 (CK_ACT16) sums the products of activation rows 2t and 2t + 1
// into output row t (the tiles and x blocks hold whole pairs: both even)
template <int QT, typename T>
static void matmul_x8(const uint8_t *w, const float *row_scale, const QAct &a, long rows, long n,
                      long k, T *out, const void *bias, int bias_dt, int split, int nthreads) {
  const long groups = (n + kGroup - 1) / kGroup, gbytes = a.nb * kGroup * block_bytes(QT);
  const bool pairs = take_pairs<QT>(rows);
  const bool stream = rows <= kStreamRows;
  long chunk = stream ? (groups + nthreads - 1) / nthreads  // in groups
                      : (row_chunk(n, nthreads) + kGroup - 1) / kGroup;
  if (pairs) chunk += chunk % 2;  // (whole pairs)
  parallel_for(groups, chunk, nthreads, n * k >= (1L << 16), [&](long lo, long hi) {
    if (stream)  // the run's first kPrefetchAhead bytes (group_dot prefetches from there on)
      for (long l = 0; l < kPrefetchAhead && l < (hi - lo) * gbytes; l += 64) __builtin_prefetch(w + lo * gbytes + l);
    for (long x0 = 0; x0 < rows; x0 += kXBlock) {  // a block of x stays in L2 across the groups
      const long x1 = rows - x0 < kXBlock ? rows : x0 + kXBlock;
      for (long g = lo, ng; g < hi; g += ng) {
        ng = pairs && g + 1 < hi ? 2 : 1;
        const long width = ng * kGroup, j0 = g * kGroup, nr = n - j0 < width ? n - j0 : width;
        float scale[2 * kGroup], bj[2 * kGroup];
        row_params(row_scale, bias, bias_dt, j0, nr, scale, bj);
        for (long t0 = x0; t0 < x1; t0 += kTile) {
          const long tt = x1 - t0 < kTile ? x1 - t0 : kTile;
          float sums[kTile * 2 * kGroup];  // [t * width + r]
          groups_dot<QT>((int)ng, w + g * gbytes, gbytes, a, t0, tt, k, sums);
          for (long t = 0; t < tt; t += split)
            for (long r = 0; r < nr; ++r) {
              const float sum = split == 2 ? sums[t * width + r] + sums[(t + 1) * width + r] : sums[t * width + r];
              from_f32(sum * scale[r] + bj[r], &out[(t0 + t) / split * n + j0 + r]);
            }
        }
      }
    }
  });
}

template <typename T>
static void matmul_typed(int qt, const uint8_t *w, const float *rs, const QAct &a, long rows,
                         long n, long k, void *out, const void *bias, int bias_dt, int split, int nt) {
  T *o = (T *)out;
  switch (qt) {
    case CK_Q8_0X8: matmul_x8<CK_Q8_0, T>(w, rs, a, rows, n, k, o, bias, bias_dt, split, nt); break;
    case CK_Q4_0X8: matmul_x8<CK_Q4_0, T>(w, rs, a, rows, n, k, o, bias, bias_dt, split, nt); break;
    case CK_Q4_1X8: matmul_x8<CK_Q4_1, T>(w, rs, a, rows, n, k, o, bias, bias_dt, split, nt); break;
    case CK_Q4FX8: matmul_x8<CK_Q4FX8, T>(w, rs, a, rows, n, k, o, bias, bias_dt, split, nt); break;
    case CK_U8FX8: matmul_x8<CK_U8FX8, T>(w, rs, a, rows, n, k, o, bias, bias_dt, split, nt); break;
    case CK_S8FX8: matmul_x8<CK_S8FX8, T>(w, rs, a, rows, n, k, o, bias, bias_dt, split, nt); break;
    default: matmul_x8<CK_INT8, T>(w, rs, a, rows, n, k, o, bias, bias_dt, split, nt); break;
  }
}

// int8-activation product on x8 weights (int16 with act16); -1 if the activation buffer could
// not be had
static int quant_matmul(int qt, const void *w, const float *row_scale, long n, long k, int dtype,
                        const void *x, long x_stride, long rows, void *out, const void *bias,
                        int bias_dtype, bool per_row, bool act16, int nthreads) {
  QAct a;
  a.nb = k / kBlock;
  const int split = act16 ? 2 : 1;
  const long qrows = split * rows;  // int8 activation rows
  char *buf = (char *)malloc(qrows * k + 2 * qrows * a.nb * sizeof(float));
  if (!buf) return -1;
  a.d = (float *)buf;
  a.s = a.d + qrows * a.nb;
  a.q = (int8_t *)(a.s + qrows * a.nb);
  auto run = [&](auto *xt) {  // xt: the activations as float or bf16_t
    typedef typename std::remove_const<typename std::remove_pointer<decltype(xt)>::type>::type T;
    if (act16)
      quantize_rows16<T>(xt, x_stride, rows, k, a, nthreads);
    else
      quantize_rows<T>(xt, x_stride, rows, k, a, per_row, nthreads);
    matmul_typed<T>(qt, (const uint8_t *)w, row_scale, a, qrows, n, k, out, bias, bias_dtype, split, nthreads);
  };
  if (dtype == CK_F32)
    run((const float *)x);
  else
    run((const bf16_t *)x);
  free(buf);
  return 0;
}

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// 1 where this build's x8 kernel is vectorized (AVX2 and up, NEON with the dot-product
// extension), 0 where it is the portable loop: the default path (CK_ACT16) is then slower on
// x8 weights than matvec.cpp's float32 kernels on the weights as stored.
int CK_FN(x8_vectorized)(void) {
#if defined(CK_GROUP_SIMD)
  return 1;
#else
  return 0;
#endif
}

// out[rows, n] (dtype, contiguous) = x[rows, k] (row stride x_stride) @ W^T (+ bias).
// W: n rows in format qt (blocks.h); row_scale: per-row scales for CK_INT8 and
// CK_INT8X8, else NULL. k must be a multiple of 32. The x8 formats take int8
// activations (above), per block of 32, or per row with CK_PER_TOKEN added to qt; with
// CK_ACT16 added int16 ones (float32 ones where act16_on_panel says so: AVX2 builds from 7 rows,
// 64 on 4-bit codes; bfloat16 ones on AVX512_BF16 builds from kBf16MinRows rows); the others float32 ones
// (matvec.cpp). Returns 0, or -1 if a scratch buffer could not be had.
int CK_FN(linear)(int qt, const void *w, const float *row_scale, long n, long k, int dtype,
                    const void *x, long x_stride, long rows, void *out, const void *bias,
                    int bias_dtype, int nthreads) {
  const bool per_row = (qt & CK_PER_TOKEN) != 0, act16 = (qt & CK_ACT16) != 0;
  qt &= ~((int)CK_PER_TOKEN | (int)CK_ACT16);
#if defined(CK_V8)
  if (act16 && act16_on_panel(qt, rows, dtype))
    return CK_FN(dequant_matmul)(qt, w, row_scale, n, k, dtype, x, x_stride, rows, out, bias,
                                 bias_dtype, nthreads);
#endif
  if (is_x8(qt))
    return quant_matmul(qt, w, row_scale, n, k, dtype, x, x_stride, rows, out, bias, bias_dtype,
                        per_row, act16, nthreads);
  return CK_FN(dequant_matmul)(qt, w, row_scale, n, k, dtype, x, x_stride, rows, out, bias,
                                 bias_dtype, nthreads);
}

}  // extern "C"
