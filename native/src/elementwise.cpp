// Row-wise kernels: RMSNorm (plain and fused with the residual add), rotary
// embedding (NeoX rotate-half), SiLU-and-mul and the KV-cache write.
// Inputs in fp32 or bf16 are widened to fp32 in registers; outputs are rounded once.
#include "common.h"

namespace CK_NS {

// a parallel region only pays off above this many elements (two cores wake in ~us)
static const long kParallelMin = 1L << 15;
// rows a thread takes at a time: a few chunks per thread, so a late thread is covered
static inline long rows_chunk(long rows, int nthreads) { return (rows + 4L * nthreads - 1) / (4L * nthreads); }

template <typename T, typename W>
static void rms_norm_rows(T *out, T *res_out, const T *x, long x_stride, const T *res,
                          long res_stride, const W *w, long rows, long n, float eps,
                          int nthreads) {
  parallel_for(rows, rows_chunk(rows, nthreads), nthreads, rows * n >= kParallelMin, [&](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      const T *xr = x + r * x_stride;
      T *o = out + r * n;
      float ss = 0.0f;
      if (res) {
        // the rounded sum is both the new residual and the norm's input (as the reference)
        const T *rr = res + r * res_stride;
        T *ro = res_out + r * n;
  #pragma omp simd reduction(+ : ss)
        for (long i = 0; i < n; ++i) {
          T s;
          from_f32(to_f32(xr[i]) + to_f32(rr[i]), &s);
          ro[i] = s;
          float f = to_f32(s);
          ss += f * f;
        }
        xr = ro;
      } else {
  #pragma omp simd reduction(+ : ss)
        for (long i = 0; i < n; ++i) {
          float f = to_f32(xr[i]);
          ss += f * f;
        }
      }
      float inv = 1.0f / __builtin_sqrtf(ss / (float)n + eps);
  #pragma omp simd
      for (long i = 0; i < n; ++i) from_f32(to_f32(xr[i]) * inv * to_f32(w[i]), &o[i]);
    }
  });
}

template <typename T, typename C>
static void rotary_rows(T *out, const T *x, long row_stride, long heads, long d,
                        const int64_t *pos, const C *cache, long rows, int nthreads) {
  long half = d / 2;
  parallel_for(rows, rows_chunk(rows, nthreads), nthreads, rows * heads * d >= kParallelMin, [&](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      const C *cs = cache + pos[r] * d;
      for (long h = 0; h < heads; ++h) {
        const T *xi = x + r * row_stride + h * d;
        T *o = out + (r * heads + h) * d;
  #pragma omp simd
        for (long i = 0; i < half; ++i) {
          float c = to_f32(cs[i]), s = to_f32(cs[half + i]);
          float x1 = to_f32(xi[i]), x2 = to_f32(xi[half + i]);
          from_f32(x1 * c - x2 * s, &o[i]);
          from_f32(x2 * c + x1 * s, &o[half + i]);
        }
      }
    }
  });
}

template <typename T>
static void silu_mul_rows(T *out, const T *x, long x_stride, long rows, long inter, int nthreads) {
  parallel_for(rows, rows_chunk(rows, nthreads), nthreads, rows * inter >= kParallelMin, [&](long lo, long hi) {
    for (long r = lo; r < hi; ++r) {
      const T *g = x + r * x_stride;
      const T *u = g + inter;
      T *o = out + r * inter;
  #pragma omp simd
      for (long i = 0; i < inter; ++i) {
        // g * u / (1 + exp(-g)): written as g / (1 + exp(-g)) * u, GCC 12 vectorizes it into a
        // loop an order of magnitude slower
        const float gf = to_f32(g[i]), e = fast_exp(-gf);
        from_f32(gf * to_f32(u[i]) / (1.0f + e), &o[i]);
      }
    }
  });
}

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// out[rows, n] = rms_norm(x) * w. With res != NULL: res_out = round(x + res) and the
// norm is taken of res_out (fused residual add). w_dtype may differ from dtype.
void CK_FN(rms_norm)(int dtype, int w_dtype, void *out, void *res_out, const void *x,
                       long x_stride, const void *res, long res_stride, const void *w,
                       long rows, long n, float eps, int nthreads) {
#define CK_RMS(T, W)                                                                   \
  rms_norm_rows<T, W>((T *)out, (T *)res_out, (const T *)x, x_stride, (const T *)res,    \
                      res_stride, (const W *)w, rows, n, eps, nthreads)
  if (dtype == CK_F32) {
    if (w_dtype == CK_F32) CK_RMS(float, float); else CK_RMS(float, bf16_t);
  } else {
    if (w_dtype == CK_F32) CK_RMS(bf16_t, float); else CK_RMS(bf16_t, bf16_t);
  }
#undef CK_RMS
}

// out[rows, heads, d] = rotate(x) where row r of x starts at r * row_stride (heads
// contiguous); cache[max_pos, d] holds cos | sin.
void CK_FN(rotary)(int dtype, int cache_dtype, void *out, const void *x, long row_stride,
                     long heads, long d, const int64_t *pos, const void *cache, long rows,
                     int nthreads) {
#define CK_ROT(T, C)                                                                  \
  rotary_rows<T, C>((T *)out, (const T *)x, row_stride, heads, d, pos, (const C *)cache, \
                    rows, nthreads)
  if (dtype == CK_F32) {
    if (cache_dtype == CK_F32) CK_ROT(float, float); else CK_ROT(float, bf16_t);
  } else {
    if (cache_dtype == CK_F32) CK_ROT(bf16_t, float); else CK_ROT(bf16_t, bf16_t);
  }
#undef CK_ROT
}

// out[rows, inter] = silu(x[:, :inter]) * x[:, inter:2*inter]
void CK_FN(silu_and_mul)(int dtype, void *out, const void *x, long x_stride, long rows,
                           long inter, int nthreads) {
  if (dtype == CK_F32)
    silu_mul_rows<float>((float *)out, (const float *)x, x_stride, rows, inter, nthreads);
  else
    silu_mul_rows<bf16_t>((bf16_t *)out, (const bf16_t *)x, x_stride, rows, inter, nthreads);
}

// Copy token t's row_bytes of k and v (rows at t * k_stride_bytes / v_stride_bytes)
// into slot slots[t] of the caches; negative slots are padding and skipped. Returns
// the number of slots >= num_slots (not written).
long CK_FN(write_kv_cache)(const void *k, long k_stride_bytes, const void *v,
                             long v_stride_bytes, void *k_cache, void *v_cache,
                             const int64_t *slots, long tokens, long row_bytes, long num_slots) {
  long bad = 0;
  for (long t = 0; t < tokens; ++t) {
    int64_t s = slots[t];
    if (s < 0) continue;
    if (s >= num_slots) {
      ++bad;
      continue;
    }
    memcpy((char *)k_cache + s * row_bytes, (const char *)k + t * k_stride_bytes, row_bytes);
    memcpy((char *)v_cache + s * row_bytes, (const char *)v + t * v_stride_bytes, row_bytes);
  }
  return bad;
}

// Structured outputs: logits[rows[j] * stride + t] = -inf where bit t % 32 of word t / 32 of
// bitmask row j is 0 (t < vocab); allowed logits and other rows are left as they are.
void CK_FN(apply_token_bitmask)(float *logits, long stride, const uint32_t *bitmask, long words,
                                  const int64_t *rows, long num_rows, long vocab) {
  const float neg_inf = -__builtin_inff();
  for (long j = 0; j < num_rows; ++j) {
    float *row = logits + rows[j] * stride;
    const uint32_t *mask = bitmask + j * words;
    for (long w = 0; w < words; ++w) {
      uint32_t m = mask[w];
      if (m == 0xFFFFFFFFu) continue;
      const long base = w * 32, end = base + 32 < vocab ? base + 32 : vocab;
      for (long t = base; t < end; ++t)
        if (!((m >> (t - base)) & 1u)) row[t] = neg_inf;
    }
  }
}

}  // extern "C"
