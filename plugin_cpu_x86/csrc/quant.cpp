// Quantized linear for small batches (decode): y[T, N] = x[T, K] @ W[N, K]^T + b.
// The activation rows are quantized to int8 per block of 32 (scale d, and s = d *
// sum(q) for the weight offsets), then each weight block is multiplied with integer
// dot products: maddubs + madd on AVX2, vpdpbusd with AVX512-VNNI. Weights stay in
// their GGUF block layout (Q8_0, Q4_0, Q4_1) or int8 rows with per-row scales.
#include <stdlib.h>

#include "blocks.h"
#include "kernels.h"

namespace CX86_NS {

static const int kTile = 4;
// the int8-activation kernel is not blocked for many rows: above this, float activations
static const long kInt8ActMaxRows = 16;

// int8 activations: q [T, K], d and s [T, K/32]
struct QAct {
  int8_t *q;
  float *d, *s;
  long nb;
};

template <typename T>
static void quantize_rows(const T *x, long x_stride, long rows, long k, QAct a) {
  for (long r = 0; r < rows; ++r) {
    for (long b = 0; b < a.nb; ++b) {
      const T *xb = x + r * x_stride + b * kBlock;
      int8_t *qb = a.q + r * k + b * kBlock;
      float amax = 0.0f;
      for (int i = 0; i < kBlock; ++i) amax = fmax_(amax, __builtin_fabsf(to_f32(xb[i])));
      const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < kBlock; ++i) {
        float v = to_f32(xb[i]) * id;
        int qi = (int)(v + (v >= 0.0f ? 0.5f : -0.5f));
        qb[i] = (int8_t)qi;
        sum += qi;
      }
      a.d[r * a.nb + b] = d;
      a.s[r * a.nb + b] = d * (float)sum;
    }
  }
}

// Decoded weight block: 32 values as bytes (unsigned nibbles or signed int8) and
// scale / offset so that value_i = dw * q_i + mw (Q4_0: q_i - 8, folded into mw).
struct WBlock {
  float dw, mw;
#if defined(__AVX2__)
  __m256i q;
#else
  int8_t q[kBlock];
#endif
};

template <int QT>
static inline void decode(const uint8_t *p, WBlock *w) {
  w->mw = 0.0f;
  if (QT == CX86_INT8) {
    w->dw = 1.0f;
  } else {
    w->dw = read_half(p);
    if (QT == CX86_Q4_1) w->mw = read_half(p + 2);
    p += QT == CX86_Q4_1 ? 4 : 2;
  }
  if (QT == CX86_Q4_0) w->mw = -8.0f * w->dw;
#if defined(__AVX2__)
  if (QT == CX86_Q8_0 || QT == CX86_INT8) {
    w->q = _mm256_loadu_si256((const __m256i *)p);
  } else {  // byte j: element j in the low nibble, element j + 16 in the high one
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    const __m128i mask = _mm_set1_epi8(0x0f);
    w->q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask),
                            _mm_and_si128(bytes, mask));
  }
#else
  if (QT == CX86_Q8_0 || QT == CX86_INT8) {
    memcpy(w->q, p, kBlock);
  } else {
    for (int j = 0; j < 16; ++j) {
      w->q[j] = (int8_t)(p[j] & 0x0f);
      w->q[j + 16] = (int8_t)(p[j] >> 4);
    }
  }
#endif
}

#if defined(__AVX2__)
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#endif

#if defined(__AVX2__)
typedef __m256 Acc;
#else
typedef float Acc;
#endif

// acc[t] += block b of weight row wr . block b of activation row t0 + t
template <int QT, int TT>
__attribute__((always_inline)) static inline void block_step(const uint8_t *wr, long b,
                                                             const QAct &a, long t0, long k,
                                                             Acc *acc, float *extra) {
  const bool is_signed = QT == CX86_Q8_0 || QT == CX86_INT8;
  WBlock w;
  decode<QT>(wr + b * block_bytes(QT), &w);
#if defined(__AVX2__)
  const __m256i wu = is_signed ? _mm256_sign_epi8(w.q, w.q) : w.q;  // |w| for the sign trick
#endif
  for (int t = 0; t < TT; ++t) {
    const long ai = (t0 + t) * a.nb + b;
    const int8_t *aq = a.q + (t0 + t) * k + b * kBlock;
#if defined(__AVX2__)
    __m256i av = _mm256_loadu_si256((const __m256i *)aq);
    if (is_signed) av = _mm256_sign_epi8(av, w.q);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(wu, av)),
                             _mm256_set1_ps(w.dw * a.d[ai]), acc[t]);
#else
    int dot = 0;
    for (int i = 0; i < kBlock; ++i) dot += (int)w.q[i] * (int)aq[i];
    acc[t] += (float)dot * w.dw * a.d[ai];
#endif
    if (!is_signed) extra[t] += w.mw * a.s[ai];
  }
}

// dot of weight row `wr` with activation rows t0 .. t0 + TT - 1; writes TT sums.
// Even and odd blocks go to separate accumulators: two independent FMA chains.
template <int QT, int TT>
static inline void row_dot(const uint8_t *wr, const QAct &a, long t0, long k, float *sums) {
  Acc acc0[TT], acc1[TT];
  float extra0[TT], extra1[TT];
  for (int t = 0; t < TT; ++t) {
#if defined(__AVX2__)
    acc0[t] = acc1[t] = _mm256_setzero_ps();
#else
    acc0[t] = acc1[t] = 0.0f;
#endif
    extra0[t] = extra1[t] = 0.0f;
  }
  long b = 0;
  for (; b + 1 < a.nb; b += 2) {
    block_step<QT, TT>(wr, b, a, t0, k, acc0, extra0);
    block_step<QT, TT>(wr, b + 1, a, t0, k, acc1, extra1);
  }
  if (b < a.nb) block_step<QT, TT>(wr, b, a, t0, k, acc0, extra0);
  for (int t = 0; t < TT; ++t) {
#if defined(__AVX2__)
    sums[t] = hsum8(_mm256_add_ps(acc0[t], acc1[t])) + extra0[t] + extra1[t];
#else
    sums[t] = acc0[t] + acc1[t] + extra0[t] + extra1[t];
#endif
  }
}

template <int QT, typename T>
static void matmul_rows(const uint8_t *w, const float *row_scale, const QAct &a, long rows,
                        long n, long k, T *out, const void *bias, int bias_dt, int nthreads) {
  const long rb = row_bytes(QT, k);
  const long chunk = row_chunk(n, nthreads);
  parallel_for(n, chunk, nthreads, n * k >= (1L << 16), [&](long lo, long hi) {
    for (long j = lo; j < hi; ++j) {
      const uint8_t *wr = w + j * rb;
      const float scale = row_scale ? row_scale[j] : 1.0f;
      const float bj = bias ? load_any(bias, bias_dt, j) : 0.0f;
      float sums[kTile];
      for (long t0 = 0; t0 < rows; t0 += kTile) {
        const long tt = rows - t0 < kTile ? rows - t0 : kTile;
        switch (tt) {
          case 1: row_dot<QT, 1>(wr, a, t0, k, sums); break;
          case 2: row_dot<QT, 2>(wr, a, t0, k, sums); break;
          case 3: row_dot<QT, 3>(wr, a, t0, k, sums); break;
          default: row_dot<QT, 4>(wr, a, t0, k, sums); break;
        }
        for (long t = 0; t < tt; ++t) from_f32(sums[t] * scale + bj, &out[(t0 + t) * n + j]);
      }
    }
  });
}

template <typename T>
static void matmul_typed(int qt, const uint8_t *w, const float *rs, const QAct &a, long rows,
                         long n, long k, void *out, const void *bias, int bias_dt, int nt) {
  T *o = (T *)out;
  switch (qt) {
    case CX86_Q8_0: matmul_rows<CX86_Q8_0, T>(w, rs, a, rows, n, k, o, bias, bias_dt, nt); break;
    case CX86_Q4_0: matmul_rows<CX86_Q4_0, T>(w, rs, a, rows, n, k, o, bias, bias_dt, nt); break;
    case CX86_Q4_1: matmul_rows<CX86_Q4_1, T>(w, rs, a, rows, n, k, o, bias, bias_dt, nt); break;
    default: matmul_rows<CX86_INT8, T>(w, rs, a, rows, n, k, o, bias, bias_dt, nt); break;
  }
}

}  // namespace CX86_NS

using namespace CX86_NS;

extern "C" {

// out[rows, n] (dtype, contiguous) = x[rows, k] (row stride x_stride) @ W^T (+ bias).
// W: n rows in format qt; row_scale: per-row scales for CX86_INT8, else NULL.
// k must be a multiple of 32. Returns 0, or -1 if the scratch buffer could not be had.
int CX86_FN(quant_matmul)(int qt, const void *w, const float *row_scale, long n, long k,
                          int dtype, const void *x, long x_stride, long rows, void *out,
                          const void *bias, int bias_dtype, int nthreads) {
  QAct a;
  a.nb = k / kBlock;
  char *buf = (char *)malloc(rows * k + 2 * rows * a.nb * sizeof(float));
  if (!buf) return -1;
  a.d = (float *)buf;
  a.s = a.d + rows * a.nb;
  a.q = (int8_t *)(a.s + rows * a.nb);
  const uint8_t *wb = (const uint8_t *)w;
  if (dtype == CX86_F32) {
    quantize_rows<float>((const float *)x, x_stride, rows, k, a);
    matmul_typed<float>(qt, wb, row_scale, a, rows, n, k, out, bias, bias_dtype, nthreads);
  } else {
    quantize_rows<bf16_t>((const bf16_t *)x, x_stride, rows, k, a);
    matmul_typed<bf16_t>(qt, wb, row_scale, a, rows, n, k, out, bias, bias_dtype, nthreads);
  }
  free(buf);
  return 0;
}

// The quantized (or float32, CX86_F32W) linear, arguments as quant_matmul's: int8
// activations when int8_act and at most kInt8ActMaxRows rows (CPU_QUANT_ACTIVATIONS; never
// for CX86_F32W), else float32 activations (matvec.cpp: exact up to float32 rounding).
int CX86_FN(linear)(int qt, const void *w, const float *row_scale, long n, long k, int dtype,
                    const void *x, long x_stride, long rows, void *out, const void *bias,
                    int bias_dtype, int int8_act, int nthreads) {
  if (int8_act && qt != CX86_F32W && rows <= kInt8ActMaxRows)
    return CX86_FN(quant_matmul)(qt, w, row_scale, n, k, dtype, x, x_stride, rows, out, bias,
                                 bias_dtype, nthreads);
  return CX86_FN(dequant_matmul)(qt, w, row_scale, n, k, dtype, x, x_stride, rows, out, bias,
                                 bias_dtype, nthreads);
}

}  // extern "C"
