// Encoder (pooling model) kernels: bidirectional attention within each sequence of a
// flattened batch, and the linear on bfloat16 weights packed once at load.
//
// encoder_attention: every query of a sequence sees every key of it (no mask, no KV cache).
// One work item is (sequence, kv head): its keys are transposed into a float [d][n] panel and
// its values widened into [n][d] once for the `group` query heads sharing them; each query's
// scores are then n-wide FMA rows over d (no horizontal sums), a float32 softmax (fast_exp)
// and value rows accumulated into d-wide sums. Plain loops the compiler vectorizes on every
// ISA of the library (x86, NEON, z vector, scalar).
//
// linear_bf16w (AVX512_BF16 builds): y = x @ W^T + bias, optionally through GELU, with W
// rounded to bfloat16 and packed in bf16_tile.h's groups at load (plugins/cpu_native/bf16.py)
// and x rounded to bfloat16 (round to nearest even, as torch's .bfloat16()) in one pass; the
// products are summed in float32 (vdpbf16ps). Activation rows are taken a block at a time
// (kXBlockBytes of bfloat16 rows, kept in L2 across the weight groups).
#include <stdlib.h>

#include <type_traits>

#include "blocks.h"
#include "simd.h"

namespace CK_NS {

#include "bf16_tile.h"

#if defined(CK_V8)
static const int kQTile = 4;  // queries a pass over a sequence's keys (and values) takes
static const int kMaxVecs = 4;  // head vectors of values a pass accumulates (16 accumulators)

// s[t][j] = q_t . k_j for the kQTile queries qf [kQTile][d] and the keys of kt ([d][np]):
// a vector of keys at a time, one FMA per query and element (no horizontal sums)
static inline void scores_tile(const float *qf, const float *kt, long np, long d, float *s) {
  for (long j = 0; j < np; j += kVW) {
    vw acc[kQTile];
    for (int t = 0; t < kQTile; ++t) acc[t] = vw_zero();
    for (long i = 0; i < d; ++i) {
      const vw kv = vw_load(kt + i * np + j);
      for (int t = 0; t < kQTile; ++t) acc[t] = vw_fma(vw_set1(qf[t * d + i]), kv, acc[t]);
    }
    for (int t = 0; t < kQTile; ++t) vw_store(s + t * np + j, acc[t]);
  }
}

// o[t][c0 .. c0 + CV * kVW) = sum over keys j < n of p[t][j] * v_j (vf [n][d])
template <int CV>
static inline void values_tile(const float *p, long np, const float *vf, long n, long d, long c0, float *o) {
  vw acc[kQTile][CV];
  for (int t = 0; t < kQTile; ++t)
    for (int c = 0; c < CV; ++c) acc[t][c] = vw_zero();
  for (long j = 0; j < n; ++j) {
    vw vv[CV];
    for (int c = 0; c < CV; ++c) vv[c] = vw_load(vf + j * d + c0 + c * kVW);
    for (int t = 0; t < kQTile; ++t) {
      const vw pt = vw_set1(p[t * np + j]);
      for (int c = 0; c < CV; ++c) acc[t][c] = vw_fma(pt, vv[c], acc[t][c]);
    }
  }
  for (int t = 0; t < kQTile; ++t)
    for (int c = 0; c < CV; ++c) vw_store(o + t * d + c0 + c * kVW, acc[t][c]);
}
#endif

// s[j] (j < n) = softmax of the scores s[j] (float32)
static inline void softmax_row(float *s, long n) {
  float m = s[0];
  for (long j = 1; j < n; ++j) m = fmax_(m, s[j]);
  float sum = 0.0f;
  for (long j = 0; j < n; ++j) {
    s[j] = fast_exp(s[j] - m);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (long j = 0; j < n; ++j) s[j] *= inv;
}

// Attention of query heads h0 .. h0 + group - 1 of one sequence (n tokens, queries q with
// token stride qs) over its keys kt ([d][np], transposed, zero past n) and values vf ([n][d]).
// Scratch: qf (kQTile x d floats), s (kQTile x np), o (kQTile x d).
template <typename T>
static void attend_group(const T *q, long qs, long h0, long group, long n, long np, long d, float scale,
                         const float *kt, const float *vf, T *out, long os, float *qf, float *s, float *o) {
#if defined(CK_V8)
  if (d % kVW == 0) {  // kQTile queries at a time; rows past n are zeros, their results unused
    for (long g = 0; g < group; ++g)
      for (long t0 = 0; t0 < n; t0 += kQTile) {
        const long tq = n - t0 < kQTile ? n - t0 : kQTile;
        for (long t = 0; t < kQTile; ++t)
          for (long i = 0; i < d; ++i) qf[t * d + i] = t < tq ? to_f32(q[(t0 + t) * qs + (h0 + g) * d + i]) * scale : 0.0f;
        scores_tile(qf, kt, np, d, s);
        for (long t = 0; t < tq; ++t) softmax_row(s + t * np, n);
        for (long c0 = 0; c0 < d; c0 += kMaxVecs * kVW) {
          switch ((d - c0) / kVW < kMaxVecs ? (d - c0) / kVW : kMaxVecs) {
            case 1: values_tile<1>(s, np, vf, n, d, c0, o); break;
            case 2: values_tile<2>(s, np, vf, n, d, c0, o); break;
            case 3: values_tile<3>(s, np, vf, n, d, c0, o); break;
            default: values_tile<4>(s, np, vf, n, d, c0, o); break;
          }
        }
        for (long t = 0; t < tq; ++t)
          for (long i = 0; i < d; ++i) from_f32(o[t * d + i], &out[(t0 + t) * os + (h0 + g) * d + i]);
      }
    return;
  }
#endif
  for (long g = 0; g < group; ++g)  // one query at a time, plain loops
    for (long t = 0; t < n; ++t) {
      for (long j = 0; j < n; ++j) s[j] = 0.0f;
      for (long i = 0; i < d; ++i) {
        const float qv = to_f32(q[t * qs + (h0 + g) * d + i]) * scale;
        for (long j = 0; j < n; ++j) s[j] += qv * kt[i * np + j];
      }
      softmax_row(s, n);
      for (long i = 0; i < d; ++i) o[i] = 0.0f;
      for (long j = 0; j < n; ++j)
        for (long i = 0; i < d; ++i) o[i] += s[j] * vf[j * d + i];
      for (long i = 0; i < d; ++i) from_f32(o[i], &out[t * os + (h0 + g) * d + i]);
    }
}

template <typename T>
static int encoder_attention_typed(T *out, const T *q, long qs, const T *k, long ks, const T *v, long vs,
                                   const int32_t *starts, long num_seqs, long hq, long hk, long d, float scale,
                                   int nthreads) {
#if defined(CK_V8)
  const long lanes = kVW, tile = kQTile;
#else
  const long lanes = 1, tile = 1;
#endif
  long max_n = 0;
  for (long i = 0; i < num_seqs; ++i) max_n = starts[i + 1] - starts[i] > max_n ? starts[i + 1] - starts[i] : max_n;
  const long max_np = (max_n + lanes - 1) / lanes * lanes, group = hq / hk, total = starts[num_seqs] - starts[0];
  int failed = 0;
  parallel_for(num_seqs * hk, 1, nthreads, total * hq * d >= (1L << 14), [&](long lo, long hi) {
    float *buf = (float *)malloc((max_np * d + max_n * d + tile * (max_np + 2 * d)) * sizeof(float));
    if (!buf) {
      __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
      return;
    }
    float *kt = buf, *vf = kt + max_np * d, *qf = vf + max_n * d, *s = qf + tile * d, *o = s + tile * max_np;
    for (long item = lo; item < hi; ++item) {
      const long seq = item / hk, kvh = item % hk, t0 = starts[seq], n = starts[seq + 1] - t0;
      const long np = (n + lanes - 1) / lanes * lanes;
      if (n <= 0) continue;
      const T *kr = k + t0 * ks + kvh * d, *vr = v + t0 * vs + kvh * d;
      for (long i = 0; i < d; ++i)
        for (long j = 0; j < np; ++j) kt[i * np + j] = j < n ? to_f32(kr[j * ks + i]) : 0.0f;
      for (long j = 0; j < n; ++j)
        for (long i = 0; i < d; ++i) vf[j * d + i] = to_f32(vr[j * vs + i]);
      attend_group(q + t0 * qs, qs, kvh * group, group, n, np, d, scale, kt, vf, out + t0 * hq * d, hq * d, qf, s, o);
    }
    free(buf);
  });
  return failed ? -1 : 0;
}

#if defined(__AVX512BF16__)
static const long kXBlockBytes = 96L << 10;
enum { kActNone = 0, kActGelu = 1, kActGeluTanh = 2 };

// erf(x) to ~1.5e-7 (Abramowitz & Stegun 7.1.26), written to vectorize (no libm call)
static inline float erf_approx(float x) {
  const float a = x < 0.0f ? -x : x, t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float y = 1.0f - p * t * fast_exp(-a * a);
  return x < 0.0f ? -y : y;
}

// GELU of x: exact (erf) or tanh-approximated; tanh(u) = 1 - 2 / (exp(2u) + 1)
static inline float gelu(float x, int act) {
  if (act == kActGelu) return 0.5f * x * (1.0f + erf_approx(x * 0.70710678118654752f));
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (2.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f));
}

// Blocks of `block` activation rows (x's share of the core's cache: kXBlockBytes) over rows, a last
// block of fewer than kOpX rows joining the one before it: each block reads every weight panel, so a
// 2-row remainder (32 rows of k = 1536: 30 + 2) cost as much as a 6-row tile's pass
static inline long row_blocks(long rows, long block) {
  return rows > block && rows % block < kOpX ? rows / block : (rows + block - 1) / block;
}

// the end of block b's rows (row_blocks' last block takes the rest)
static inline long block_end(long b, long blocks, long block, long rows) {
  return b + 1 == blocks ? rows : (b + 1) * block;
}

template <typename T>
static int bf16_linear_typed(const uint32_t *wp, long n, long k, const T *x, long xs, long rows, T *out,
                             const void *bias, int bias_dt, int act, int nt) {
  const long kp = k / 2, groups = (n + kOpW - 1) / kOpW;
  const bf16_t *xb = NULL;
  long xbs = k;
  bf16_t *rounded = NULL;
  if constexpr (std::is_same<T, bf16_t>::value) {
    xb = x;
    xbs = xs;
  } else {  // k is a multiple of 32: two vectors of 16 floats round to one of 32 bfloat16
    rounded = (bf16_t *)aligned_alloc(64, (rows * k * sizeof(bf16_t) + 63) / 64 * 64);
    if (!rounded) return -1;
    parallel_for(rows, 16, nt, rows * k >= (1L << 16), [&](long lo, long hi) {
      for (long r = lo; r < hi; ++r)
        for (long i = 0; i < k; i += 32)
          _mm512_storeu_si512(rounded + r * k + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + r * xs + i + 16),
                                                                                 _mm512_loadu_ps(x + r * xs + i)));
    });
    xb = rounded;
  }
  long block = kXBlockBytes / (k * (long)sizeof(bf16_t)) / kOpX * kOpX;
  block = block < kOpX ? kOpX : block;
  // items (row block, group, column part): whole groups, or halves of kOpW / 2 columns where whole
  // groups leave 2+ threads fewer than 8 items each (the 32-row decode steps: 9 groups of the 576
  // output columns would split 5 / 4 on 2 threads)
  const long blocks = row_blocks(rows, block), parts = nt > 1 && blocks * groups < 8L * nt ? 2 : 1,
             items = blocks * groups * parts, cols = kOpW / parts;
  // runs of consecutive items a claim (~16 a thread): on whole groups, a group's first kOpC tiles
  // prefetch the next group of its run, a quarter each
  const long per_claim = items / (16L * (nt > 1 ? nt : 1)), run = per_claim > 1 ? per_claim : 1;
  parallel_for(items, run, nt, rows * n * k >= (1L << 18), [&](long lo, long hi) {
    alignas(64) float tile[kOpX * kOpW];
    for (long item = lo; item < hi; ++item) {
      const long g = item / parts % groups, b = item / parts / groups, j = g * kOpW + item % parts * cols;
      const long rw = n - j < cols ? n - j : cols, r1 = block_end(b, blocks, block, rows);
      if (rw <= 0) continue;  // the second half of a last group of kOpW / 2 columns or fewer
      const uint32_t *w = wp + g * kp * kOpW + (j - g * kOpW);
      const uint32_t *next = parts == 1 && item + 1 < hi ? wp + (item + 1) % groups * kp * kOpW : NULL;
      float scale[kOpW], bj[kOpW];
      row_params(NULL, bias, bias_dt, j, rw, scale, bj);
      for (long t0 = b * block; t0 < r1; t0 += kOpX) {
        const long tx = r1 - t0 < kOpX ? r1 - t0 : kOpX, quarter = (t0 - b * block) / kOpX;
        if (parts == 1)
          op_tile_rows<kOpC>(tx, w, kp, xb + t0 * xbs, xbs, tile,
                             next && quarter < kOpC ? next + quarter * kp * 16 : NULL);
        else
          op_tile_rows<kOpC / 2>(tx, w, kp, xb + t0 * xbs, xbs, tile, NULL);
        if (act == kActNone) {
          op_tile_out(tile, tx, rw, NULL, bj, out + t0 * n + j, n);
          continue;
        }
        for (long t = 0; t < tx; ++t) {
          float *row = tile + t * kOpW;
          for (long r = 0; r < rw; ++r) row[r] = gelu(row[r] + bj[r], act);
          for (long r = 0; r < rw; ++r) from_f32(row[r], &out[(t0 + t) * n + j + r]);
        }
      }
    }
  });
  free(rounded);
  return 0;
}

// out rows t < tx (row stride n) = SiLU(gate) * up of a gate tile and an up tile's kOpW columns
// (kOpX x kOpW floats each) plus their bias (bg, bu), bit-equal to silu_and_mul (elementwise.cpp)
// on linear_bf16w's output: gate and up rounded to bfloat16 as op_tile_out does, g u / (1 +
// fast_exp(-g)) (exp16: the same values), rounded as from_f32 (denormals kept, NaN quiet). Not
// inlined: its ~20 constants, hoisted into bf16_silu_mul's loops, would spill op_tile's accumulators
__attribute__((noinline)) static void silu_mul_tile(const float *gate, const float *up, long tx, const float *bg, const float *bu,
                                 bf16_t *out, long n) {
  const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), inf = _mm512_set1_epi32(0x7f800000);
  for (long t = 0; t < tx; ++t)
    for (long r = 0; r < kOpW; r += 16) {
      const __m512 g = _mm512_add_ps(_mm512_loadu_ps(gate + t * kOpW + r), _mm512_loadu_ps(bg + r));
      const __m512 u = _mm512_add_ps(_mm512_loadu_ps(up + t * kOpW + r), _mm512_loadu_ps(bu + r));
      const __m512 gr = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(g)), 16));
      const __m512 ur = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(u)), 16));
      const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gr));
      const __m512i y = _mm512_castps_si512(_mm512_div_ps(_mm512_mul_ps(gr, ur), _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
      const __m512i rounded = _mm512_srli_epi32(
          _mm512_add_epi32(_mm512_add_epi32(y, half), _mm512_and_si512(_mm512_srli_epi32(y, 16), one)), 16);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(y, _mm512_set1_epi32(0x7fffffff)), inf);
      const __m512i b = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(y, 16), _mm512_set1_epi32(0x40));
      _mm256_storeu_si256((__m256i *)(out + t * n + r), _mm512_cvtepi32_epi16(b));
    }
}

// out[rows, inter] = SiLU(gate) * up of x[rows, k] @ W^T + bias, W gate_up's 2 * inter rows
// packed as linear_bf16w's (gate's, then up's; inter a multiple of kOpW). Each item (row block,
// group of kOpW gate columns) takes the gate group's tiles and the matching up group's, so the
// [rows, 2 * inter] product is never written; the first kOpC gate (up) tiles pull in the next
// item's gate (up) group, a quarter each (bf16_tile.h's `next`), as linear_bf16w's run ahead.
static int bf16_silu_mul(const uint32_t *wp, long inter, long k, const bf16_t *x, long xs, long rows, bf16_t *out,
                         const void *bias, int bias_dt, int nt) {
  const long kp = k / 2, groups = inter / kOpW;
  long block = kXBlockBytes / (k * (long)sizeof(bf16_t)) / kOpX * kOpX;
  block = block < kOpX ? kOpX : block;
  const long blocks = row_blocks(rows, block), items = blocks * groups;
  const long per_claim = items / (16L * (nt > 1 ? nt : 1)), run = per_claim > 1 ? per_claim : 1;
  parallel_for(items, run, nt, rows * 2 * inter * k >= (1L << 18), [&](long lo, long hi) {
    alignas(64) float gate[kOpX * kOpW], up[kOpX * kOpW];
    for (long item = lo; item < hi; ++item) {
      const long g = item % groups, b = item / groups, r1 = block_end(b, blocks, block, rows);
      const uint32_t *wg = wp + g * kp * kOpW, *wu = wp + (groups + g) * kp * kOpW;
      const uint32_t *next_g = item + 1 < hi ? wp + (item + 1) % groups * kp * kOpW : NULL;
      const uint32_t *next_u = next_g ? next_g + groups * kp * kOpW : NULL;
      float unit[kOpW], bg[kOpW], bu[kOpW];
      row_params(NULL, bias, bias_dt, g * kOpW, kOpW, unit, bg);
      row_params(NULL, bias, bias_dt, inter + g * kOpW, kOpW, unit, bu);
      for (long t0 = b * block; t0 < r1; t0 += kOpX) {
        const long tx = r1 - t0 < kOpX ? r1 - t0 : kOpX, quarter = (t0 - b * block) / kOpX;
        const bool ahead = next_g && quarter < kOpC;
        op_tile_rows<kOpC>(tx, wg, kp, x + t0 * xs, xs, gate, ahead ? next_g + quarter * kp * 16 : NULL);
        op_tile_rows<kOpC>(tx, wu, kp, x + t0 * xs, xs, up, ahead ? next_u + quarter * kp * 16 : NULL);
        silu_mul_tile(gate, up, tx, bg, bu, out + t0 * inter + g * kOpW, inter);
      }
    }
  });
  return 0;
}
#endif  // __AVX512BF16__

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// out [T, hq, d] (dtype, contiguous) = bidirectional attention of each sequence's queries
// q [T, hq, d] over its keys k / values v [T, hk, d] (dtype; heads contiguous, token strides
// qs, ks, vs in elements), sequence i owning rows starts[i] .. starts[i + 1] - 1; query head h
// reads kv head h / (hq / hk). Returns 0, or -1 if a scratch buffer could not be had.
int CK_FN(encoder_attention)(int dtype, void *out, const void *q, long qs, const void *k, long ks, const void *v,
                             long vs, const int32_t *starts, long num_seqs, long hq, long hk, long d, float scale,
                             int nthreads) {
  if (dtype == CK_F32)
    return encoder_attention_typed<float>((float *)out, (const float *)q, qs, (const float *)k, ks,
                                          (const float *)v, vs, starts, num_seqs, hq, hk, d, scale, nthreads);
  return encoder_attention_typed<bf16_t>((bf16_t *)out, (const bf16_t *)q, qs, (const bf16_t *)k, ks,
                                         (const bf16_t *)v, vs, starts, num_seqs, hq, hk, d, scale, nthreads);
}

// 1 where this build has linear_bf16w (AVX512_BF16), else 0. (Not "bf16_linear": the neon build's
// ck_neon_bf16_linear is the neon_bf16 build's linear, and both link into one library.)
int CK_FN(linear_bf16w_ready)(void) {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}

// The fewest activation rows of a bfloat16 product on a GGUF/int8 weight that take the weight's
// bfloat16 panels (linear_bf16w) over its own format: from 8 rows the products are compute-bound and
// vdpbf16ps on weights packed once outruns dequantizing them per product (Zen 4, 2 threads: 8 rows of
// 960x576 1.3x, 32 rows of 3072x576 1.5x the Q4_1 path). 0 (never) on builds without AVX512_BF16 and
// on AMX builds, whose tile kernels are faster still. The one declaration of this choice: decode.cpp
// and plugins/cpu_native (CPU_BF16_PREPACK) read it.
int CK_FN(bf16_panel_min_rows)(void) {
#if defined(__AVX512BF16__) && !defined(__AMX_BF16__)
  return 8;
#else
  return 0;
#endif
}

// out[rows, n] (dtype, contiguous) = act(x[rows, k] @ W^T + bias): W packed by
// plugins/cpu_native/bf16.py (bf16_tile.h's groups of 64 rows, k-pairs x rows, zero rows past
// n), x of dtype with row stride x_stride, k a multiple of 32; act 0 none, 1 GELU (erf), 2 GELU
// (tanh). Returns 0, -1 if a buffer could not be had, -2 on builds without AVX512_BF16.
int CK_FN(linear_bf16w)(const void *w, long n, long k, int dtype, const void *x, long x_stride, long rows,
                       void *out, const void *bias, int bias_dtype, int act, int nthreads) {
#if defined(__AVX512BF16__)
  const uint32_t *wp = (const uint32_t *)w;
  if (dtype == CK_F32)
    return bf16_linear_typed<float>(wp, n, k, (const float *)x, x_stride, rows, (float *)out, bias, bias_dtype, act,
                                    nthreads);
  return bf16_linear_typed<bf16_t>(wp, n, k, (const bf16_t *)x, x_stride, rows, (bf16_t *)out, bias, bias_dtype,
                                   act, nthreads);
#else
  return -2;
#endif
}

// out[rows, inter] (bfloat16, contiguous) = SiLU(gate) * up of the bfloat16 x[rows, k] (row stride
// x_stride) @ W^T + bias, W a gate_up projection's 2 * inter rows (gate's, then up's) packed as
// linear_bf16w's: bit-equal to linear_bf16w into [rows, 2 * inter] followed by silu_and_mul,
// without that intermediate. Returns 0, -2 on builds without AVX512_BF16, -3 where inter is not
// a multiple of the packed groups' 64 rows (the caller takes the two passes).
int CK_FN(linear_bf16w_silu_mul)(const void *w, long inter, long k, const void *x, long x_stride, long rows,
                                void *out, const void *bias, int bias_dtype, int nthreads) {
#if defined(__AVX512BF16__)
  if (inter % kOpW) return -3;
  return bf16_silu_mul((const uint32_t *)w, inter, k, (const bf16_t *)x, x_stride, rows, (bf16_t *)out, bias,
                       bias_dtype, nthreads);
#else
  return -2;
#endif
}

}  // extern "C"
