// Paged attention over the flattened mixed prefill + decode batch of
// plugins/attention.py. One work item is (token, kv head): the `group` query heads
// sharing that kv head are done together so each cached K/V row is loaded once.
// Online softmax over chunks of keys; query i of a sequence sees keys
// 0 .. seq_len - query_len + i (causal with offset), only the last `window` of them in a
// sliding-window layer (window > 0). A bfloat16 or float16 cache under float32 queries is
// read in place, widened as it is loaded (half the bytes of a float32 cache: decode reads
// every cached row once a step); a one-byte cache (fp8.h) is decoded a chunk of rows at a
// time into float rows, times the layer's K/V scale. Prompts of kTilePrompt or more tokens go on
// 16 x 16 tiles instead (attention_tiles.h: tile_prompts): the tile unit's (AMX builds), or
// vdpbf16ps ones under bfloat16 compute (AVX512_BF16 builds without the tile unit).
#include <stdlib.h>

#include <type_traits>

#include "amx.h"
#include "fp8.h"
#include "simd.h"

namespace CK_NS {

static const int kMaxHead = 256, kMaxGroup = 16, kChunk = 32;
#if defined(CK_V8)
static constexpr bool kVecAttention = true;  // the vw score and value tiles below
static constexpr int kLanes = kVW;
#else
static constexpr bool kVecAttention = false;
static constexpr int kLanes = 1;
#endif

// index of the sequence owning token t (starts is non-decreasing); -1 if none
static inline long find_seq(const int32_t *starts, long num_seqs, long t) {
  long lo = 0, hi = num_seqs;  // invariant: starts[lo] <= t < starts[hi]
  if (num_seqs == 0 || t >= starts[num_seqs]) return -1;
  while (hi - lo > 1) {
    long mid = (lo + hi) / 2;
    if (starts[mid] <= t) lo = mid; else hi = mid;
  }
  return lo;
}

// the element type the math reads a cached row as: float rows decoded from one-byte caches
template <typename C> struct RowOf { typedef C type; };
template <> struct RowOf<uint8_t> { typedef float type; };

// row[i] = the value of one-byte code p[i] (format `code`, fp8.h) * scale, for i < d: through
// lut, or on x86 eight at a time as IEEE halves (F16C): E5M2 is a half's top byte; E4M3's seven
// bits placed as a half's exponent and mantissa are its value * 2^-8, its subnormals a half's
// (both exact, as are the products: lut[b] = half * 256 exactly); E4M3's 0x7f / 0xff are NaN
static inline void fp8_row(const uint8_t *p, long d, int code, const float *lut, float scale, float *row) {
  long i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  const bool e4m3 = code == CK_FP8_E4M3;
  const __m256 s = _mm256_set1_ps(e4m3 ? 256.0f * scale : scale), nan = _mm256_set1_ps(__builtin_nanf(""));
  const __m128i low7 = _mm_set1_epi16(0x7f), sign = _mm_set1_epi16(0x80);
  for (; i + 8 <= d; i += 8) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + i)));
    const __m128i mag = _mm_and_si128(b, low7);
    const __m128i h = e4m3 ? _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(b, sign), 8))
                           : _mm_slli_epi16(b, 8);
    __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), s);
    if (e4m3) v = _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, low7))));
    _mm256_storeu_ps(row + i, v);
  }
#endif
  (void)code;
  for (; i < d; ++i) row[i] = lut[p[i]] * scale;
}

// the cache K/V rows of keys j0 .. j0 + n - 1 for kv head kvh: pointers into the cache, or
// (one-byte cache of format code) rows decoded (fp8_row) and scaled into kbuf / vbuf
template <typename C, typename R>
static inline void cache_rows(const C *kc, const C *vc, const int32_t *table, long j0, long n,
                              long block_size, long hk, long kvh, long d, const float *lut, int code,
                              float k_scale, float v_scale, float (*kbuf)[kMaxHead],
                              float (*vbuf)[kMaxHead], const R **krow, const R **vrow) {
  long block = j0 / block_size, offset = j0 % block_size;  // of key j0 + j, stepped (no division a key)
  for (long j = 0; j < n; ++j, ++offset) {
    if (offset == block_size) offset = 0, ++block;
    const long slot = (long)table[block] * block_size + offset;
    const C *kr = kc + (slot * hk + kvh) * d, *vr = vc + (slot * hk + kvh) * d;
    if constexpr (sizeof(C) == 1) {
      fp8_row((const uint8_t *)kr, d, code, lut, k_scale, kbuf[j]);
      fp8_row((const uint8_t *)vr, d, code, lut, v_scale, vbuf[j]);
      krow[j] = kbuf[j];
      vrow[j] = vbuf[j];
    } else {
      krow[j] = kr;
      vrow[j] = vr;
    }
  }
}

// K/V rows of keys j0 .. j0 + n - 1 for kv head kvh asked for ahead of their use
template <typename C>
static inline void prefetch_rows(const C *kc, const C *vc, const int32_t *table, long j0, long n,
                                 long block_size, long hk, long kvh, long d) {
  const long bytes = d * (long)sizeof(C);
  for (long j = 0; j < n; ++j) {
    const long key = j0 + j, slot = (long)table[key / block_size] * block_size + key % block_size;
    const char *kr = (const char *)(kc + (slot * hk + kvh) * d), *vr = (const char *)(vc + (slot * hk + kvh) * d);
    for (long b = 0; b < bytes; b += 64) {
      __builtin_prefetch(kr + b);
      __builtin_prefetch(vr + b);
    }
  }
}

#if defined(CK_V8)
// Query heads of a group done in one pass over a chunk's K/V rows, so that each row is
// loaded once for all of them, and keys a pass of scores takes at a time (each q load
// shared), in the build's widest vectors (vw: 16 floats on AVX-512, 8 elsewhere).
// AVX-512's 32 registers hold 4 x 4 score sums (and 4 heads x 4 output vectors); the 16
// of AVX2 (and the 32 half-size ones of NEON and z) 3 x 4 (3 heads x 2 vectors).
#if defined(__AVX512F__)
static const int kHeadTile = 4, kColVecs = 4;
#else
static const int kHeadTile = 3, kColVecs = 2;
#endif

// keys a pass of scores takes for G heads: enough score sums to fill one vw_hsum
static constexpr int key_tile(int G) { return G >= 3 ? 4 : kVW / G; }

// p[g][j] = q_g . k_j, for heads g < G and keys j < n (d a multiple of kVW)
template <int G, typename R>
static inline void tile_scores(const float (*qf)[kMaxHead], const R *const *krow, long n, long d,
                               float (*p)[kChunk]) {
  constexpr int keys = key_tile(G), count = keys * G, padded = (count + kVW - 1) / kVW * kVW;
  long j = 0;
  for (; j + keys <= n; j += keys) {
    vw acc[padded];  // [g * keys + key]
    for (int a = 0; a < padded; ++a) acc[a] = vw_zero();
    for (long i = 0; i < d; i += kVW) {
      vw qv[G];
      for (int g = 0; g < G; ++g) qv[g] = vw_load(&qf[g][i]);
      for (int kk = 0; kk < keys; ++kk) {
        const vw kv = vw_load(krow[j + kk] + i);
        for (int g = 0; g < G; ++g) acc[g * keys + kk] = vw_fma(qv[g], kv, acc[g * keys + kk]);
      }
    }
    alignas(64) float sums[padded];
    for (int a = 0; a < padded; a += kVW) vw_hsum(acc + a, sums + a);  // lane sums, kVW at a time
    for (int g = 0; g < G; ++g) memcpy(&p[g][j], &sums[g * keys], keys * sizeof(float));  // a head's keys in a row
  }
  for (; j < n; ++j) {  // the last keys, one at a time
    vw acc[kVW];
    for (int g = 0; g < kVW; ++g) acc[g] = vw_zero();
    for (long i = 0; i < d; i += kVW) {
      const vw kv = vw_load(krow[j] + i);
      for (int g = 0; g < G; ++g) acc[g] = vw_fma(vw_load(&qf[g][i]), kv, acc[g]);
    }
    float sums[kVW];
    vw_hsum(acc, sums);
    for (int g = 0; g < G; ++g) p[g][j] = sums[g];
  }
}

#if defined(__AVX512BF16__)
// p[g][j] = scale * q_g . k_j for heads g < G and keys j < n, the bfloat16 q rows qh[g] and K rows
// taken 32 elements at a time by vdpbf16ps (two products a lane, float32 sums): K is not widened
// to float32, and a pass of keys takes half the instructions of tile_scores (d a multiple of 32)
template <int G>
static inline void tile_scores_bf16(const bf16_t *const *qh, const bf16_t *const *krow, long n, long d, float scale,
                                    float (*p)[kChunk]) {
  constexpr int keys = key_tile(G), count = keys * G, padded = (count + kVW - 1) / kVW * kVW;
  long j = 0;
  for (; j + keys <= n; j += keys) {
    vw acc[padded];  // [g * keys + key]
    for (int a = 0; a < padded; ++a) acc[a] = vw_zero();
    for (long i = 0; i < d; i += 32) {
      __m512bh qv[G];
      for (int g = 0; g < G; ++g) qv[g] = (__m512bh)_mm512_loadu_si512(qh[g] + i);
      for (int kk = 0; kk < keys; ++kk) {
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(krow[j + kk] + i);
        for (int g = 0; g < G; ++g) acc[g * keys + kk] = _mm512_dpbf16_ps(acc[g * keys + kk], qv[g], kv);
      }
    }
    alignas(64) float sums[padded];
    for (int a = 0; a < padded; a += kVW) vw_hsum(acc + a, sums + a);
    for (int g = 0; g < G; ++g)
      for (int kk = 0; kk < keys; ++kk) p[g][j + kk] = scale * sums[g * keys + kk];
  }
  for (; j < n; ++j) {  // the last keys, one at a time
    vw acc[kVW];
    for (int g = 0; g < kVW; ++g) acc[g] = vw_zero();
    for (long i = 0; i < d; i += 32) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(krow[j] + i);
      for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbf16_ps(acc[g], (__m512bh)_mm512_loadu_si512(qh[g] + i), kv);
    }
    float sums[kVW];
    vw_hsum(acc, sums);
    for (int g = 0; g < G; ++g) p[g][j] = scale * sums[g];
  }
}

// acc[g] += sum over keys j < n of p[g][j] v_j for heads g < G, the bfloat16 V rows taken two keys
// at a time by vdpbf16ps: the probabilities rounded to bfloat16 pairs (p_j, p_j+1) (as prompt
// attention's bfloat16 P), the two rows' columns interleaved into pairs by one permute a 16
// columns (an odd last key paired with probability 0); d a multiple of 64
template <int G>
static inline void tile_values_bf16(const float (*p)[kChunk], const bf16_t *const *vrow, long n, long d,
                                    float (*acc)[kMaxHead]) {
  alignas(64) uint32_t pairs[G][kChunk / 2];
  for (int g = 0; g < G; ++g) {
    const __mmask16 m0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    const __mmask16 m1 = n >= kChunk ? (__mmask16)0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    _mm512_store_si512(pairs[g], (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, &p[g][16]),
                                                              _mm512_maskz_loadu_ps(m0, &p[g][0])));
  }
  // lane i of a pair vector: column i of the first row, then of the second
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                      5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (long c = 0; c < d; c += 64) {
    vw a[G][4];
    for (int g = 0; g < G; ++g)
      for (int cv = 0; cv < 4; ++cv) a[g][cv] = vw_load(&acc[g][c + kVW * cv]);
    for (long j = 0; j < n; j += 2) {
      const bf16_t *v0 = vrow[j] + c, *v1 = (j + 1 < n ? vrow[j + 1] : vrow[j]) + c;
      const __m512i x0 = _mm512_loadu_si512(v0), y0 = _mm512_loadu_si512(v1);
      const __m512i x1 = _mm512_loadu_si512(v0 + 32), y1 = _mm512_loadu_si512(v1 + 32);
      const __m512bh b[4] = {(__m512bh)_mm512_permutex2var_epi16(x0, lo, y0),
                             (__m512bh)_mm512_permutex2var_epi16(x0, hi, y0),
                             (__m512bh)_mm512_permutex2var_epi16(x1, lo, y1),
                             (__m512bh)_mm512_permutex2var_epi16(x1, hi, y1)};
      for (int g = 0; g < G; ++g) {
        const __m512bh pv = (__m512bh)_mm512_set1_epi32((int)pairs[g][j / 2]);
        for (int cv = 0; cv < 4; ++cv) a[g][cv] = _mm512_dpbf16_ps(a[g][cv], pv, b[cv]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int cv = 0; cv < 4; ++cv) vw_store(&acc[g][c + kVW * cv], a[g][cv]);
  }
}

// tile_values_bf16 for the group's heads, kHeadTile at a time
static inline void group_values_bf16(long group, const float (*p)[kChunk], const bf16_t *const *vrow, long n, long d,
                                     float (*acc)[kMaxHead]) {
  for (long g0 = 0; g0 < group; g0 += kHeadTile) {
    switch (group - g0 < kHeadTile ? group - g0 : kHeadTile) {
      case 1: tile_values_bf16<1>(p + g0, vrow, n, d, acc + g0); break;
      case 2: tile_values_bf16<2>(p + g0, vrow, n, d, acc + g0); break;
      case 3: tile_values_bf16<3>(p + g0, vrow, n, d, acc + g0); break;
      default: tile_values_bf16<kHeadTile>(p + g0, vrow, n, d, acc + g0); break;
    }
  }
}

// tile_scores_bf16 for the group's heads, kHeadTile at a time
static inline void group_scores_bf16(long group, const bf16_t *const *qh, const bf16_t *const *krow, long n, long d,
                                     float scale, float (*p)[kChunk]) {
  for (long g0 = 0; g0 < group; g0 += kHeadTile) {
    switch (group - g0 < kHeadTile ? group - g0 : kHeadTile) {
      case 1: tile_scores_bf16<1>(qh + g0, krow, n, d, scale, p + g0); break;
      case 2: tile_scores_bf16<2>(qh + g0, krow, n, d, scale, p + g0); break;
      case 3: tile_scores_bf16<3>(qh + g0, krow, n, d, scale, p + g0); break;
      default: tile_scores_bf16<kHeadTile>(qh + g0, krow, n, d, scale, p + g0); break;
    }
  }
}
#endif

// acc[g] += sum over keys j < n of p[g][j] v_j, for heads g < G (d a multiple of kVW * CV)
template <int G, int CV, typename R>
static inline void tile_values(const float (*p)[kChunk], const R *const *vrow, long n, long d,
                               float (*acc)[kMaxHead]) {
  for (long c = 0; c < d; c += kVW * CV) {
    vw a[G][CV];
    for (int g = 0; g < G; ++g)
      for (int cv = 0; cv < CV; ++cv) a[g][cv] = vw_load(&acc[g][c + kVW * cv]);
    for (long j = 0; j < n; ++j) {
      vw v[CV];
      for (int cv = 0; cv < CV; ++cv) v[cv] = vw_load(vrow[j] + c + kVW * cv);
      for (int g = 0; g < G; ++g) {
        const vw pj = vw_set1(p[g][j]);
        for (int cv = 0; cv < CV; ++cv) a[g][cv] = vw_fma(pj, v[cv], a[g][cv]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int cv = 0; cv < CV; ++cv) vw_store(&acc[g][c + kVW * cv], a[g][cv]);
  }
}

// p[g][j] for the group's heads, kHeadTile at a time
template <typename R>
static inline void group_scores(long group, const float (*qf)[kMaxHead], const R *const *krow, long n,
                                long d, float (*p)[kChunk]) {
  for (long g0 = 0; g0 < group; g0 += kHeadTile) {
    switch (group - g0 < kHeadTile ? group - g0 : kHeadTile) {
      case 1: tile_scores<1, R>(qf + g0, krow, n, d, p + g0); break;
      case 2: tile_scores<2, R>(qf + g0, krow, n, d, p + g0); break;
      case 3: tile_scores<3, R>(qf + g0, krow, n, d, p + g0); break;
      default: tile_scores<kHeadTile, R>(qf + g0, krow, n, d, p + g0); break;
    }
  }
}

// acc[g] += p[g] . V for the group's heads, kHeadTile at a time
template <int CV, typename R>
static inline void group_values(long group, const float (*p)[kChunk], const R *const *vrow, long n,
                                long d, float (*acc)[kMaxHead]) {
  for (long g0 = 0; g0 < group; g0 += kHeadTile) {
    switch (group - g0 < kHeadTile ? group - g0 : kHeadTile) {
      case 1: tile_values<1, CV, R>(p + g0, vrow, n, d, acc + g0); break;
      case 2: tile_values<2, CV, R>(p + g0, vrow, n, d, acc + g0); break;
      case 3: tile_values<3, CV, R>(p + g0, vrow, n, d, acc + g0); break;
      default: tile_values<kHeadTile, CV, R>(p + g0, vrow, n, d, acc + g0); break;
    }
  }
}
#endif

// One chunk's online-softmax update of a head: p[0, nv) (its scores) become exp(p - new max), p[nv, n)
// (keys it does not see) 0, the running max m and sum l move on, and the output accumulator acc
// [d] is rescaled to the new max.
static inline void softmax_chunk(float *p, long nv, long n, float &m, float &l, float *acc, long d) {
  float mx = m;
#pragma omp simd reduction(max : mx)
  for (long j = 0; j < nv; ++j) mx = fmax_(mx, p[j]);
  const float corr = fast_exp(m - mx);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (long j = 0; j < nv; ++j) {
    p[j] = fast_exp(p[j] - mx);
    sum += p[j];
  }
  for (long j = nv; j < n; ++j) p[j] = 0.0f;
  l = l * corr + sum;
  m = mx;
  if (corr != 1.0f) {
#pragma omp simd
    for (long i = 0; i < d; ++i) acc[i] *= corr;
  }
}

#if defined(__AVX512BF16__)
static const long kRowMax = 512;  // elements of a key's K (V) row over every kv head that attend_decode_rows takes

// out [hq, d] = one decode token's attention, every query head at once, keys first_key .. n_keys - 1
// (all visible), bfloat16 q, out and caches (hq <= kMaxGroup, hk * d <= kRowMax, d a multiple of
// 64): each chunk's K and V rows are copied whole (every kv head: one run of bytes a key, in key
// order) before the heads read them (group_scores_bf16 / group_values_bf16, a kv head's group at a
// time). Read a kv head's share at a time (128 of a row's 384 bytes on the default model), the same
// bytes came from memory ~3.5x slower: the core's prefetchers do not follow that pattern.
static void attend_decode_rows(bf16_t *out, const bf16_t *q, const bf16_t *kc, const bf16_t *vc, const int32_t *table,
                               long first_key, long n_keys, long hq, long hk, long d, long block_size, float scale) {
  const long group = hq / hk, row = hk * d;
  alignas(64) bf16_t kb[kChunk][kRowMax], vb[kChunk][kRowMax];
  float acc[kMaxGroup][kMaxHead], m[kMaxGroup], l[kMaxGroup], p[kMaxGroup][kChunk];
  const bf16_t *qh[kMaxGroup], *krow[kChunk], *vrow[kChunk];
  for (long h = 0; h < hq; ++h) {
    qh[h] = q + h * d;
    for (long i = 0; i < d; ++i) acc[h][i] = 0.0f;
    m[h] = -3.0e38f;
    l[h] = 0.0f;
  }
  for (long j0 = first_key; j0 < n_keys; j0 += kChunk) {
    const long n = imin_(kChunk, n_keys - j0);
    long block = j0 / block_size, offset = j0 % block_size;  // of key j0 + j, stepped
    for (long j = 0; j < n; ++j, ++offset) {
      if (offset == block_size) offset = 0, ++block;
      const long slot = (long)table[block] * block_size + offset;
      memcpy(kb[j], kc + slot * row, row * sizeof(bf16_t));
      memcpy(vb[j], vc + slot * row, row * sizeof(bf16_t));
    }
    for (long kvh = 0; kvh < hk; ++kvh) {
      for (long j = 0; j < n; ++j) krow[j] = kb[j] + kvh * d;
      group_scores_bf16(group, qh + kvh * group, krow, n, d, scale, p + kvh * group);
    }
    for (long h = 0; h < hq; ++h) softmax_chunk(p[h], n, n, m[h], l[h], acc[h], d);  // every key visible
    for (long kvh = 0; kvh < hk; ++kvh) {
      for (long j = 0; j < n; ++j) vrow[j] = vb[j] + kvh * d;
      group_values_bf16(group, p + kvh * group, vrow, n, d, acc + kvh * group);
    }
  }
  for (long h = 0; h < hq; ++h) {
    const float inv = 1.0f / l[h];
    for (long i = 0; i < d; ++i) from_f32(acc[h][i] * inv, &out[h * d + i]);
  }
}
#endif

// A work item: query tokens [first, first + count) of one sequence (count 1 outside prefill),
// with one kv head.
struct QueryTile {
  long first, count;
};

// The batch's tokens cut into tiles of up to `per_tile` consecutive tokens of a sequence
// (tokens past the last sequence, padding, one a tile), but for sequences s with done[s]
// (done may be NULL).
static long query_tiles(const int32_t *starts, long num_seqs, long tokens, long per_tile, const bool *done,
                        QueryTile *tiles) {
  long n = 0;
  for (long s = 0; s < num_seqs; ++s)
    for (long t = starts[s]; t < starts[s + 1] && !(done && done[s]); t += per_tile)
      tiles[n++] = {t, starts[s + 1] - t < per_tile ? starts[s + 1] - t : per_tile};
  for (long t = num_seqs ? starts[num_seqs] : 0; t < tokens; ++t) tiles[n++] = {t, 1};
  return n;
}

// Prefill tokens of a sequence done together see the same keys but for the last few (causal):
// the tile's heads ("virtual heads" u * group + g, at most kMaxGroup) share each K/V row
// load, and a key a token must not see gets probability 0. Up to 4 tokens a tile.
static const long kQueryTile = 4;

#include "attention_tiles.h"  // AVX512_BF16 builds: tile_prompts, prompts on tiles

template <typename T, typename C>
static void attend(T *out, const T *q, long q_stride, const C *kc, const C *vc,
                   const int32_t *starts, const int32_t *seq_lens, const int32_t *tables,
                   long table_stride, long tokens, long num_seqs, long hq, long hk, long d,
                   long block_size, float scale, long window, const float *lut, int code,
                   float k_scale, float v_scale, int nthreads) {
  typedef typename RowOf<C>::type R;
  const long group = hq / hk;
  // sliding-window layers: one token a tile (each token's window starts elsewhere)
  long per_tile = window > 0 ? 1 : kMaxGroup / group;
  per_tile = per_tile < 1 ? 1 : per_tile > kQueryTile ? kQueryTile : per_tile;
  bool *done = NULL;  // sequences whose prompts went on tiles (AVX512_BF16 builds)
#if defined(__AMX_BF16__)
  if (amx_ready())
    done = tile_prompts<AmxTiles, T, C>(out, q, q_stride, kc, vc, starts, seq_lens, tables, table_stride, num_seqs, hq,
                                        hk, d, block_size, scale, window, lut, code, k_scale, v_scale, nthreads);
#endif
#if defined(__AVX512BF16__)
  // without the tile unit, bfloat16 compute only: float32's three products a multiply would not
  // outrun the float32 vector path
  if constexpr (std::is_same<T, bf16_t>::value)
    if (!done)
      done = tile_prompts<VecTiles, T, C>(out, q, q_stride, kc, vc, starts, seq_lens, tables, table_stride, num_seqs,
                                          hq, hk, d, block_size, scale, window, lut, code, k_scale, v_scale, nthreads);
#endif
  QueryTile tile_buf[256];
  QueryTile *tiles = tokens + num_seqs <= 256 ? tile_buf : (QueryTile *)malloc((tokens + num_seqs) * sizeof(QueryTile));
  // no memory for the tile list: token by token (tiles of 1, made in place below)
  const long num_tiles = tiles ? query_tiles(starts, num_seqs, tokens, per_tile, done, tiles) : tokens;
  const bool vec = kVecAttention && d % kLanes == 0;
  // bfloat16 queries on a bfloat16 cache, AVX512_BF16 builds: scores by vdpbf16ps (group_scores_bf16)
#if defined(__AVX512BF16__)
  const bool scores_bf16 = std::is_same<T, bf16_t>::value && std::is_same<R, bf16_t>::value && d % 32 == 0;
  [[maybe_unused]] const bool values_bf16 = scores_bf16 && d % 64 == 0;  // and values (group_values_bf16)
  // decode tokens: every head in one item reading whole K/V rows (attend_decode_rows)
  [[maybe_unused]] const bool rows_whole = values_bf16 && hq <= kMaxGroup && hk * d <= kRowMax;
#else
  const bool scores_bf16 = false;
#endif
  // with tiles enough to share out, a tile's kv heads on one thread: they read the same
  // cache lines' neighbours (a slot's kv heads lie side by side), which the core's
  // prefetcher then brings in once
  const long per_claim = num_tiles >= 4L * nthreads ? hk : 1;
  // the keys a work item sees: its sequence s (-1: padding), keys first_key .. n_keys - 1,
  // token u of the tile the first first_visible + u of them
  struct ItemKeys {
    QueryTile tile;
    long kvh, s, first_visible, first_key, n_keys;
    const int32_t *table;
    bool decode;  // one query token in its sequence: its K/V rows are read once, from memory
  };
  auto keys_of = [&](long item) {
    ItemKeys it = {tiles ? tiles[item / hk] : QueryTile{item / hk, 1}, item % hk, -1, 0, 0, 0, NULL, false};
    it.s = find_seq(starts, num_seqs, it.tile.first);
    const long seq_len = it.s < 0 ? 0 : seq_lens[it.s];
    if (seq_len == 0) {
      it.s = -1;
      return it;
    }
    const long q_len = starts[it.s + 1] - starts[it.s];
    it.first_visible = seq_len - q_len + (it.tile.first - starts[it.s]) + 1;
    it.n_keys = it.first_visible + it.tile.count - 1;
    it.first_key = window > 0 && it.n_keys > window ? it.n_keys - window : 0;
    it.table = tables + it.s * table_stride;
    it.decode = q_len == 1;
    return it;
  };
  parallel_for(num_tiles * hk, per_claim, nthreads, num_tiles * hk > 1, [&](long lo, long hi) {
    for (long item = lo; item < hi; ++item) {
      const ItemKeys it = keys_of(item);
      const QueryTile tile = it.tile;
      const long kvh = it.kvh, heads = tile.count * group;  // virtual heads u * group + g
      if (it.s < 0) {  // padding token / sequence: defined as zeros
        for (long u = 0; u < tile.count; ++u)
          for (long i = 0; i < group * d; ++i) from_f32(0.0f, &out[((tile.first + u) * hq + kvh * group) * d + i]);
        continue;
      }
      const long first_visible = it.first_visible, n_keys = it.n_keys, first_key = it.first_key;
      const int32_t *table = it.table;
#if defined(__AVX512BF16__)
      if constexpr (std::is_same<T, bf16_t>::value && std::is_same<C, bf16_t>::value)
        if (rows_whole && it.decode) {  // kv head 0's item does the token's every head
          if (kvh == 0)
            attend_decode_rows(out + tile.first * hq * d, q + tile.first * q_stride, kc, vc, table, first_key, n_keys,
                               hq, hk, d, block_size, scale);
          continue;
        }
#endif

      float qf[kMaxGroup][kMaxHead], acc[kMaxGroup][kMaxHead];
      float m[kMaxGroup], l[kMaxGroup], p[kMaxGroup][kChunk];
      float kbuf[sizeof(C) == 1 ? kChunk : 1][kMaxHead], vbuf[sizeof(C) == 1 ? kChunk : 1][kMaxHead];
      const T *qh[kMaxGroup];  // each virtual head's query row
      for (long h = 0; h < heads; ++h) {
        qh[h] = q + (tile.first + h / group) * q_stride + (kvh * group + h % group) * d;
        for (long i = 0; i < d; ++i) {
          qf[h][i] = to_f32(qh[h][i]) * scale;
          acc[h][i] = 0.0f;
        }
        m[h] = -3.0e38f;
        l[h] = 0.0f;
      }
      for (long j0 = first_key; j0 < n_keys; j0 += kChunk) {
        const long n = imin_(kChunk, n_keys - j0);
        const R *krow[kChunk], *vrow[kChunk];
        cache_rows<C, R>(kc, vc, table, j0, n, block_size, hk, kvh, d, lut, code, k_scale, v_scale,
                         kbuf, vbuf, krow, vrow);
        // decode items: the next chunk's rows asked for while this one's are worked on (at the
        // last chunk, the next item's first): the core's own prefetcher left the loads waiting,
        // K/V read well below the memory's rate. Prefill items read rows the tiles before them
        // brought in
        if (it.decode && j0 + kChunk < n_keys) {
          prefetch_rows(kc, vc, table, j0 + kChunk, imin_(kChunk, n_keys - j0 - kChunk), block_size, hk, kvh, d);
        } else if (it.decode && item + 1 < hi) {
          const ItemKeys next = keys_of(item + 1);
          if (next.s >= 0 && next.decode)
            prefetch_rows(kc, vc, next.table, next.first_key, imin_(kChunk, next.n_keys - next.first_key), block_size, hk,
                          next.kvh, d);
        }
#if defined(__AVX512BF16__)
        if constexpr (std::is_same<T, bf16_t>::value && std::is_same<R, bf16_t>::value)
          if (scores_bf16) group_scores_bf16(heads, qh, krow, n, d, scale, p);
#endif
#if defined(CK_V8)
        if (vec && !scores_bf16) group_scores<R>(heads, qf, krow, n, d, p);
#endif
        for (long h = 0; h < heads && !vec && !scores_bf16; ++h)
          for (long j = 0; j < n; ++j) {
            float dot = 0.0f;
  #pragma omp simd reduction(+ : dot)
            for (long i = 0; i < d; ++i) dot += qf[h][i] * to_f32(krow[j][i]);
            p[h][j] = dot;
          }
        for (long h = 0; h < heads; ++h) {
          // this chunk's keys token h / group sees; the rest get probability 0
          const long seen = first_visible + h / group - j0, nv = seen < n ? (seen > 0 ? seen : 0) : n;
          softmax_chunk(p[h], nv, n, m[h], l[h], acc[h], d);
        }
#if defined(__AVX512BF16__)
        if constexpr (std::is_same<T, bf16_t>::value && std::is_same<R, bf16_t>::value)
          if (values_bf16) {
            group_values_bf16(heads, p, vrow, n, d, acc);
            continue;
          }
#endif
#if defined(CK_V8)
        if (vec) {
          if (d % (kVW * kColVecs) == 0)
            group_values<kColVecs, R>(heads, p, vrow, n, d, acc);
          else
            group_values<1, R>(heads, p, vrow, n, d, acc);
          continue;
        }
#endif
        for (long j = 0; j < n; ++j) {
          const R *vr = vrow[j];
          for (long h = 0; h < heads; ++h) {
            const float pj = p[h][j];
  #pragma omp simd
            for (long i = 0; i < d; ++i) acc[h][i] += pj * to_f32(vr[i]);
          }
        }
      }
      for (long h = 0; h < heads; ++h) {
        T *o = out + ((tile.first + h / group) * hq + kvh * group + h % group) * d;
        const float inv = 1.0f / l[h];
        for (long i = 0; i < d; ++i) from_f32(acc[h][i] * inv, &o[i]);
      }
    }
  });
  if (tiles != tile_buf) free(tiles);
  free(done);
}

// x[0 .. n) stored as cache_dtype at dst: bfloat16, float16, or one-byte codes of x / scale (fp8.h)
template <typename T>
static void cast_row(const T *x, long n, int cache_dtype, float scale, void *dst) {
  if (cache_dtype == CK_BF16) {
    bf16_t *o = (bf16_t *)dst;
    for (long i = 0; i < n; ++i) from_f32(to_f32(x[i]), &o[i]);
  } else if (cache_dtype == CK_F16) {
    f16_t *o = (f16_t *)dst;
    for (long i = 0; i < n; ++i) from_f32(to_f32(x[i]), &o[i]);
  } else {
    uint8_t *o = (uint8_t *)dst;
    for (long i = 0; i < n; ++i) o[i] = f32_to_fp8(to_f32(x[i]) / scale, cache_dtype);
  }
}

}  // namespace CK_NS

using namespace CK_NS;

extern "C" {

// Limits the Python side checks before calling paged_attention.
long CK_FN(attention_max_head)(void) { return kMaxHead; }
long CK_FN(attention_max_group)(void) { return kMaxGroup; }

// out[tokens, hq, d] (contiguous) = attention of q (row t at t * q_stride, heads
// contiguous) over caches [num_blocks, block_size, hk, d] of cache_dtype (dtype, CK_BF16 or
// CK_F16 under CK_F32, or a one-byte code of fp8.h whose values are scaled by k_scale /
// v_scale); starts =
// query_start_loc [num_seqs + 1], seq_lens [num_seqs], tables [num_seqs, table_stride]
// (all int32); window > 0: a sliding-window layer's window (each query sees its last
// `window` positions), 0: the whole context. Blocks before a query's window are not read.
// Returns 0, or -1 (nothing read or written) for a (dtype, cache_dtype) pair not listed above.
int CK_FN(paged_attention)(int dtype, int cache_dtype, void *out, const void *q, long q_stride,
                             const void *k_cache, const void *v_cache, float k_scale,
                             float v_scale, const int32_t *starts, const int32_t *seq_lens,
                             const int32_t *tables, long table_stride, long tokens,
                             long num_seqs, long hq, long hk, long d, long block_size,
                             float scale, long window, int nthreads) {
  const bool widened = dtype == CK_F32 && (cache_dtype == CK_BF16 || cache_dtype == CK_F16);
  if ((dtype != CK_F32 && dtype != CK_BF16) || !(is_fp8(cache_dtype) || cache_dtype == dtype || widened)) return -1;
  if (is_fp8(cache_dtype)) {
    float lut[256];
    for (int b = 0; b < 256; ++b) lut[b] = fp8_to_f32((uint8_t)b, cache_dtype);
    const uint8_t *kc = (const uint8_t *)k_cache, *vc = (const uint8_t *)v_cache;
    if (dtype == CK_F32)
      attend<float, uint8_t>((float *)out, (const float *)q, q_stride, kc, vc, starts, seq_lens,
                             tables, table_stride, tokens, num_seqs, hq, hk, d, block_size,
                             scale, window, lut, cache_dtype, k_scale, v_scale, nthreads);
    else
      attend<bf16_t, uint8_t>((bf16_t *)out, (const bf16_t *)q, q_stride, kc, vc, starts,
                              seq_lens, tables, table_stride, tokens, num_seqs, hq, hk, d,
                              block_size, scale, window, lut, cache_dtype, k_scale, v_scale, nthreads);
  } else if (dtype == CK_F32 && cache_dtype == CK_F16) {
    attend<float, f16_t>((float *)out, (const float *)q, q_stride, (const f16_t *)k_cache,
                         (const f16_t *)v_cache, starts, seq_lens, tables, table_stride,
                         tokens, num_seqs, hq, hk, d, block_size, scale, window, NULL, cache_dtype, 1.0f, 1.0f,
                         nthreads);
  } else if (dtype == CK_F32 && cache_dtype == CK_BF16) {
    attend<float, bf16_t>((float *)out, (const float *)q, q_stride, (const bf16_t *)k_cache,
                          (const bf16_t *)v_cache, starts, seq_lens, tables, table_stride,
                          tokens, num_seqs, hq, hk, d, block_size, scale, window, NULL, cache_dtype, 1.0f, 1.0f,
                          nthreads);
  } else if (dtype == CK_F32) {
    attend<float, float>((float *)out, (const float *)q, q_stride, (const float *)k_cache,
                         (const float *)v_cache, starts, seq_lens, tables, table_stride,
                         tokens, num_seqs, hq, hk, d, block_size, scale, window, NULL, cache_dtype, 1.0f, 1.0f,
                         nthreads);
  } else {
    attend<bf16_t, bf16_t>((bf16_t *)out, (const bf16_t *)q, q_stride, (const bf16_t *)k_cache,
                           (const bf16_t *)v_cache, starts, seq_lens, tables, table_stride,
                           tokens, num_seqs, hq, hk, d, block_size, scale, window, NULL, cache_dtype, 1.0f, 1.0f,
                           nthreads);
  }
  return 0;
}

// Rows t of k and v (dtype; row t at t * k_stride / v_stride elements, row = kv_heads *
// head_dim values) stored into slot slots[t] of caches of another dtype, cache_dtype:
// bfloat16 or float16 (rounded to nearest even, from float32) or a one-byte code of fp8.h
// holding x / k_scale, x / v_scale. Negative slots are padding and skipped. Returns the
// number of slots >= num_slots (not written), or -1 (nothing written) for a dtype other than
// CK_F32 and CK_BF16 or a cache_dtype not listed above.
long CK_FN(write_kv_cache_cast)(int dtype, int cache_dtype, const void *k, long k_stride,
                                  const void *v, long v_stride, void *k_cache, void *v_cache,
                                  const int64_t *slots, long tokens, long row, long num_slots,
                                  float k_scale, float v_scale) {
  if ((dtype != CK_F32 && dtype != CK_BF16) || !(cache_dtype == CK_BF16 || cache_dtype == CK_F16 || is_fp8(cache_dtype)))
    return -1;
  long bad = 0;
  const long row_bytes = row * (cache_dtype == CK_BF16 || cache_dtype == CK_F16 ? 2 : 1);
  for (long t = 0; t < tokens; ++t) {
    const int64_t s = slots[t];
    if (s < 0) continue;
    if (s >= num_slots) {
      ++bad;
      continue;
    }
    char *kc = (char *)k_cache + s * row_bytes, *vc = (char *)v_cache + s * row_bytes;
    if (dtype == CK_F32) {
      cast_row((const float *)k + t * k_stride, row, cache_dtype, k_scale, kc);
      cast_row((const float *)v + t * v_stride, row, cache_dtype, v_scale, vc);
    } else {
      cast_row((const bf16_t *)k + t * k_stride, row, cache_dtype, k_scale, kc);
      cast_row((const bf16_t *)v + t * v_stride, row, cache_dtype, v_scale, vc);
    }
  }
  return bad;
}

}  // extern "C"
