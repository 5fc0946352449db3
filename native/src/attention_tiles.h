// attention.cpp's prompt attention on 16 x 16 tiles of TDPBF16PS's operand layouts: on the tile
// unit (AMX builds) or, with vdpbf16ps standing in for it, on AVX512_BF16 CPUs without one (Zen
// 4/5; bfloat16 compute only). A part of attention.cpp's translation unit, included inside its
// namespace ahead of attend, which hands tile_prompts the batch first. Uses attention.cpp's
// kMaxHead, kChunk, RowOf and cache_rows, simd.h and amx.h.
#pragma once

#include "bf16_tile.h"  // exp16

#if defined(__AVX512BF16__)
// Prompt attention on tiles. A sequence with kTilePrompt or more query tokens (d a multiple of 32)
// has its K/V rows packed once a kv head into the tiles' operand layouts; then each 16 of its
// query tokens, one query head at a time, are the columns of S^T = K Q^T over 32 keys at a time
// (two C tiles: keys as rows), of the online softmax, lane by lane (a token's maximum and sum are
// a lane's: no reduction across a vector), and of O^T += V^T P^T (one C tile per 16 columns of d,
// four at a time), transposed back at the end. Float32 compute (the tile unit only) splits Q, K,
// P and V into bfloat16 hi + lo and takes three products a multiply (matvec_amx.h's scheme: ~2^-17
// of a product); bfloat16 compute takes hi . hi alone, P rounded to bfloat16.
static const long kTilePrompt = 16;
static const long kTilePackMax = 256L << 20;  // bytes of packed K/V a call may take; more: the vector path

// exp on 16 lanes for a softmax whose probabilities are rounded to bfloat16 (2^-9 of a value):
// relative error ~4e-5. x is clamped below at -87 (exp ~1.6e-38); n = round(x log2 e),
// r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2], exp(r)'s Taylor polynomial of degree 4 scaled by 2^n
// (vscalefps). Lanes above 88 give inf or NaN: only where a mask drops them.
static inline __m512 exp16_bf16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945309f), x);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 24), r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The softmax's exp: exp16_bf16 where P is rounded to bfloat16 (bfloat16 compute), else exp16
template <bool kHiOnly>
static inline __m512 softmax_exp16(__m512 x) {
  if constexpr (kHiOnly)
    return exp16_bf16(x);
  else
    return exp16(x);
}

// 16 values as bfloat16 in the low halves of 32-bit lanes: hi (v rounded) and lo (the rest rounded)
static inline void split16(__m512 v, __m512i *hi, __m512i *lo) {
  *hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v));
  const __m512 rest = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(*hi, 16)));
  *lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(rest));
}

// 16 keys' rows (valid of them; the rest zeros) as the A tiles of S^T = K Q^T: for each 32-value
// step s of d, the rows' 32 values as they are; hi, then (float32 compute) lo 512 values on
template <bool kHiOnly, typename R>
static inline void tile_pack_keys(const R *const *rows, long valid, long d, uint16_t *dst) {
  constexpr long parts = kHiOnly ? 1 : 2;
  for (long s = 0; s < d / 32; ++s)
    for (long j = 0; j < 16; ++j) {
      __m512i hi = _mm512_setzero_si512(), lo = hi;
      if (j < valid) {
        const __m512 v0 = vw_load(rows[j] + 32 * s), v1 = vw_load(rows[j] + 32 * s + 16);
        if constexpr (kHiOnly)
          hi = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
        else
          split32(v0, v1, &hi, &lo);
      }
      _mm512_store_si512(dst + s * parts * 512 + 32 * j, hi);
      if constexpr (!kHiOnly) _mm512_store_si512(dst + s * parts * 512 + 512 + 32 * j, lo);
    }
}

// two rows of 16 values (a, b) as bfloat16 pairs in 32-bit lanes (lane c: a[c], b[c]): hi, and
// lo = the rest rounded
static inline void pair16(__m512 a, __m512 b, __m512i *hi, __m512i *lo) {
  __m512i ha, la, hb, lb;
  split16(a, &ha, &la);
  split16(b, &hb, &lb);
  *hi = _mm512_or_si512(ha, _mm512_slli_epi32(hb, 16));
  *lo = _mm512_or_si512(la, _mm512_slli_epi32(lb, 16));
}

// 32 keys' rows (valid of them; the rest zeros) as the A tiles of O^T = V^T P^T: for each 16
// columns c of d, 16 rows (the columns) x 32 keys, keys 2 kk and 2 kk + 1 in lane kk (the keys'
// pairs, transposed); hi, then (float32 compute) lo 512 values on
template <bool kHiOnly, typename R>
static inline void tile_pack_values(const R *const *rows, long valid, long d, uint16_t *dst) {
  constexpr long parts = kHiOnly ? 1 : 2;
  for (long c = 0; c < d / 16; ++c) {
    __m512i hi[16], lo[16], t[16];
    for (long kk = 0; kk < 16; ++kk) {
      const __m512 a = 2 * kk < valid ? vw_load(rows[2 * kk] + 16 * c) : _mm512_setzero_ps();
      const __m512 b = 2 * kk + 1 < valid ? vw_load(rows[2 * kk + 1] + 16 * c) : _mm512_setzero_ps();
      pair16(a, b, &hi[kk], &lo[kk]);
    }
    uint16_t *tile = dst + c * parts * 512;
    transpose16(hi, t);
    for (int r = 0; r < 16; ++r) _mm512_store_si512(tile + 32 * r, t[r]);
    if constexpr (!kHiOnly) {
      transpose16(lo, t);
      for (int r = 0; r < 16; ++r) _mm512_store_si512(tile + 512 + 32 * r, t[r]);
    }
  }
}

// The products of tile_prompt_item (tile_scores, tile_values), one way per unit: on the tile
// unit's registers (AmxTiles: four C tiles 0-3, C tile C += A B is TDPBF16PS on A's tiles 6 (hi)
// and 7 (lo) and B's tiles 4 (hi) and 5 (lo), whose register numbers the instructions take as
// literals, hence the cases), or with vdpbf16ps on zmm registers (VecTiles: the overloads below
// keep a C tile's rows in registers, per row m of A and k-pair kk one vdpbf16ps of A's pair
// (m, kk) broadcast with B's row kk). Both: begin() on the calling thread before the first
// product, end() after the last.
#if defined(__AMX_BF16__)
#define CK_TILE_CASES(OP) \
  if constexpr (C == 0) { \
    OP(0)                 \
  } else if constexpr (C == 1) { \
    OP(1)                 \
  } else if constexpr (C == 2) { \
    OP(2)                 \
  } else {                \
    OP(3)                 \
  }
#define CK_TILE_ZERO(N) _tile_zero(N);
#define CK_TILE_STORE(N) _tile_stored(N, dst, 64);
#define CK_TILE_PRODUCTS(N)    \
  _tile_dpbf16ps(N, 6, 4);     \
  if constexpr (!kHiOnly) {    \
    _tile_dpbf16ps(N, 7, 4);   \
    _tile_dpbf16ps(N, 6, 5);   \
  }
struct AmxTiles {
  static bool ready() { return amx_ready(); }
  void begin() { amx_configure(); }
  void end() { _tile_release(); }
  template <int C> void zero() { CK_TILE_CASES(CK_TILE_ZERO) }
  template <bool kHiOnly> void load_b(const uint16_t *b) {
    _tile_loadd(4, b, 64);
    if constexpr (!kHiOnly) _tile_loadd(5, b + 512, 64);
  }
  // C tile C += A B for A's tiles at a (hi; float32 compute: lo 512 values on, their product with B's hi)
  template <int C, bool kHiOnly> void products(const uint16_t *a) {
    _tile_loadd(6, a, 64);
    if constexpr (!kHiOnly) _tile_loadd(7, a + 512, 64);
    CK_TILE_CASES(CK_TILE_PRODUCTS)
  }
  template <int C> void store(float *dst) { CK_TILE_CASES(CK_TILE_STORE) }
};
#undef CK_TILE_PRODUCTS
#undef CK_TILE_STORE
#undef CK_TILE_ZERO
#undef CK_TILE_CASES
#endif  // __AMX_BF16__

// vdpbf16ps in zmm registers: no tile state, only tile_scores / tile_values' overloads below
struct VecTiles {
  static bool ready() { return true; }
  void begin() {}
  void end() {}
};

// S^T for keys j0 .. j0 + 31 (32 x 16 tokens, float32) into sc: for each 16 keys (C tile 0, and
// tile 1 if `both`, else zeros) the sum over d's steps of K's A tiles at kp (a step's 512 values
// apart, the second 16 keys `steps` steps on) times Q^T's B tiles at qt
template <bool kHiOnly, typename Tiles>
static inline void tile_scores(Tiles &tiles, const uint16_t *qt, const uint16_t *kp, long steps, bool both, float *sc) {
  constexpr long parts = kHiOnly ? 1 : 2;
  tiles.template zero<0>();
  tiles.template zero<1>();
  for (long s = 0; s < steps; ++s) {
    tiles.template load_b<kHiOnly>(qt + s * parts * 512);
    tiles.template products<0, kHiOnly>(kp + s * parts * 512);
    if (both) tiles.template products<1, kHiOnly>(kp + (steps + s) * parts * 512);
  }
  tiles.template store<0>(sc);
  tiles.template store<1>(sc + 256);
}

// O^T = O^T corr + V^T P^T for the 16 columns x 16 tokens of acc per 16 columns of d (cols of
// them): V's A tiles at va (a column tile's 512 values apart) times P^T's B tile at pt, whose key
// pairs from `pairs` on are zeros (the tile unit takes all 16 in one product regardless)
template <bool kHiOnly, typename Tiles>
static inline void tile_values(Tiles &tiles, const uint16_t *pt, const uint16_t *va, long cols, long /*pairs*/,
                               __m512 corr, float *acc) {
  constexpr long parts = kHiOnly ? 1 : 2;
  alignas(64) float ob[64 * 16];
  tiles.template load_b<kHiOnly>(pt);
  for (long c0 = 0; c0 < cols; c0 += 4) {  // 64 columns of d at a time
    const long nc = cols - c0 < 4 ? cols - c0 : 4;
    const uint16_t *v = va + c0 * parts * 512;
    tiles.template zero<0>();
    tiles.template zero<1>();
    tiles.template zero<2>();
    tiles.template zero<3>();
    tiles.template products<0, kHiOnly>(v);
    if (nc > 1) tiles.template products<1, kHiOnly>(v + parts * 512);
    if (nc > 2) tiles.template products<2, kHiOnly>(v + 2 * parts * 512);
    if (nc > 3) tiles.template products<3, kHiOnly>(v + 3 * parts * 512);
    tiles.template store<0>(ob);
    tiles.template store<1>(ob + 256);
    tiles.template store<2>(ob + 512);
    tiles.template store<3>(ob + 768);
    float *a = acc + 16 * 16 * c0;
    for (long i = 0; i < 16 * nc; ++i)
      _mm512_store_ps(a + 16 * i, _mm512_fmadd_ps(_mm512_load_ps(a + 16 * i), corr, _mm512_load_ps(ob + 16 * i)));
  }
}

// A's bfloat16 pair (m, kk) of a 16 x 32 tile broadcast to the 16 lanes
static inline __m512bh tile_pair(const uint16_t *a, long m, long kk) {
  int32_t pair;
  memcpy(&pair, a + 32 * m + 2 * kk, 4);
  return (__m512bh)_mm512_set1_epi32(pair);
}

// tile_scores on vdpbf16ps: a C tile's 16 rows (keys) are 16 accumulators in registers,
// independent chains over d's k-pairs, each one vdpbf16ps of K's broadcast pair with Q^T's row
template <bool kHiOnly>
static inline void tile_scores(VecTiles &, const uint16_t *qt, const uint16_t *kp, long steps, bool both, float *sc) {
  static_assert(kHiOnly, "vdpbf16ps tiles take bfloat16 compute only (hi . hi)");
  for (long half = 0; half < 2; ++half) {
    __m512 c[16];
    for (int m = 0; m < 16; ++m) c[m] = _mm512_setzero_ps();
    const long n = half == 0 || both ? steps : 0;  // the second 16 keys' scores stay zeros without `both`
    for (long s = 0; s < n; ++s) {
      const uint16_t *a = kp + (half * steps + s) * 512, *b = qt + s * 512;
      for (int kk = 0; kk < 16; ++kk) {
        const __m512bh bv = (__m512bh)_mm512_load_si512(b + 32 * kk);
        for (int m = 0; m < 16; ++m) c[m] = _mm512_dpbf16_ps(c[m], bv, tile_pair(a, m, kk));
      }
    }
    for (int m = 0; m < 16; ++m) _mm512_store_ps(sc + 256 * half + 16 * m, c[m]);
  }
}

// tile_values' vdpbf16ps loop over the first kPairs k-pairs of P^T's rows p
template <int kPairs>
static inline void tile_values_pairs(const __m512bh *p, const uint16_t *va, long cols, __m512 corr, float *acc) {
  for (long c = 0; c < cols; ++c)
    for (int r0 = 0; r0 < 16; r0 += 8) {
      float *a = acc + 16 * (16 * c + r0);
      const uint16_t *v = va + c * 512 + 32 * r0;
      __m512 o[8];
      for (int m = 0; m < 8; ++m) o[m] = _mm512_mul_ps(_mm512_load_ps(a + 16 * m), corr);
      for (int kk = 0; kk < kPairs; ++kk)
        for (int m = 0; m < 8; ++m) o[m] = _mm512_dpbf16_ps(o[m], p[kk], tile_pair(v, m, kk));
      for (int m = 0; m < 8; ++m) _mm512_store_ps(a + 16 * m, o[m]);
    }
}

// tile_values on vdpbf16ps: P^T's 16 rows stay in registers; per 8 rows of O^T (columns of d)
// 8 accumulators loaded, times corr, then the first `pairs` k-pairs (16, or 8 where the block's
// second 16 keys are all masked) of V's broadcast pair with P^T's row each, interleaved over the
// 8 rows, and stored once
template <bool kHiOnly>
static inline void tile_values(VecTiles &, const uint16_t *pt, const uint16_t *va, long cols, long pairs,
                               __m512 corr, float *acc) {
  static_assert(kHiOnly, "vdpbf16ps tiles take bfloat16 compute only (hi . hi)");
  __m512bh p[16];
  for (int kk = 0; kk < 16; ++kk) p[kk] = (__m512bh)_mm512_load_si512(pt + 32 * kk);
  if (pairs == 8) {
    tile_values_pairs<8>(p, va, cols, corr, acc);
    return;
  }
  tile_values_pairs<16>(p, va, cols, corr, acc);
}

// One work item: query tokens t0 .. t0 + rows - 1 (rows <= 16) of a sequence, the query heads
// of kv head kvh, over its packed K (kp) and V (vp). Token r sees keys 0 .. first_visible + r - 1,
// in a sliding-window layer (window > 0) the last `window` of them.
// Transposed (keys and columns of d as rows, the 16 tokens as columns), the online softmax's
// maxima and sums are lane-wise, with no reduction across a vector. The calling thread's tiles
// are ready (tiles.begin()).
template <typename T, typename Tiles>
static void tile_prompt_item(Tiles &tiles, T *out, const T *q, long q_stride, long t0, long rows, long first_visible,
                             long window, long hq, long kvh, long group, long d, float scale, const uint16_t *kp,
                             const uint16_t *vp) {
  constexpr bool kHiOnly = std::is_same<T, bf16_t>::value;
  constexpr long parts = kHiOnly ? 1 : 2;
  const long steps = d / 32, cols = d / 16, n_keys = first_visible + rows - 1;
  const long first_key = window > 0 && first_visible > window ? first_visible - window : 0;  // token 0's first
  const __mmask16 tokens = (__mmask16)((1u << rows) - 1);
  alignas(64) uint16_t qt[kMaxHead / 32 * 2 * 512], pt[2 * 512];
  alignas(64) float sc[32 * 16], acc[kMaxHead * 16];  // [key or column][token]
  for (long g = 0; g < group; ++g) {
    const long h = kvh * group + g;
    for (long s = 0; s < steps; ++s) {  // Q^T's B tiles: a step's 16 pairs of d x 16 tokens, scaled
      __m512i hi[16], lo[16], t[16];
      const __m512 sv = _mm512_set1_ps(scale);
      for (long r = 0; r < 16; ++r) {
        hi[r] = lo[r] = _mm512_setzero_si512();
        if (r >= rows) continue;
        const T *qr = q + (t0 + r) * q_stride + h * d + 32 * s;
        const __m512 v0 = _mm512_mul_ps(vw_load(qr), sv), v1 = _mm512_mul_ps(vw_load(qr + 16), sv);
        if constexpr (kHiOnly)
          hi[r] = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
        else
          split32(v0, v1, &hi[r], &lo[r]);
      }
      transpose16(hi, t);
      for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(qt + s * parts * 512 + 32 * kk, t[kk]);
      if constexpr (!kHiOnly) {
        transpose16(lo, t);
        for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(qt + s * parts * 512 + 512 + 32 * kk, t[kk]);
      }
    }
    __m512 m = _mm512_set1_ps(-3.0e38f), l = _mm512_setzero_ps();
    for (long i = 0; i < d; ++i) _mm512_store_ps(acc + 16 * i, _mm512_setzero_ps());
    for (long j0 = first_key / 32 * 32; j0 < n_keys; j0 += 32) {
      const long kb = j0 / 32;
      tile_scores<kHiOnly>(tiles, qt, kp + 2 * kb * steps * parts * 512, steps, j0 + 16 < n_keys, sc);
      // key j0 + j is seen by tokens r >= j0 + j - first_visible + 1 (a sliding window: and
      // r <= j0 + j + window - first_visible)
      __mmask16 seen[32];
      __m512 mx = m;
      for (long j = 0; j < 32; ++j) {
        const long from = j0 + j - first_visible + 1, to = window > 0 ? j0 + j + window - first_visible : 15;
        seen[j] = from <= 0 ? tokens : from >= 16 ? 0 : (__mmask16)(tokens & (0xffffu << from));
        if (to < 15) seen[j] = to < 0 ? 0 : (__mmask16)(seen[j] & (0xffffu >> (15 - to)));
        mx = _mm512_mask_max_ps(mx, seen[j], mx, _mm512_load_ps(sc + 16 * j));
      }
      const __m512 corr = softmax_exp16<kHiOnly>(_mm512_sub_ps(m, mx));
      __m512 sum = _mm512_setzero_ps();
      const long pairs = j0 + 16 < n_keys ? 16 : 8;  // 8: keys j0 + 16 .. are masked for every token
      for (long kk = pairs; kk < 16; ++kk) {
        _mm512_store_si512(pt + 32 * kk, _mm512_setzero_si512());
        if constexpr (!kHiOnly) _mm512_store_si512(pt + 512 + 32 * kk, _mm512_setzero_si512());
      }
      for (long kk = 0; kk < pairs; ++kk) {  // P^T's B tile: 16 pairs of keys x 16 tokens
        const __m512 p0 =
            _mm512_maskz_mov_ps(seen[2 * kk], softmax_exp16<kHiOnly>(_mm512_sub_ps(_mm512_load_ps(sc + 32 * kk), mx)));
        const __m512 p1 = _mm512_maskz_mov_ps(
            seen[2 * kk + 1], softmax_exp16<kHiOnly>(_mm512_sub_ps(_mm512_load_ps(sc + 32 * kk + 16), mx)));
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
        __m512i hi, lo;
        pair16(p0, p1, &hi, &lo);
        _mm512_store_si512(pt + 32 * kk, hi);
        if constexpr (!kHiOnly) _mm512_store_si512(pt + 512 + 32 * kk, lo);
      }
      l = _mm512_fmadd_ps(l, corr, sum);
      m = mx;
      tile_values<kHiOnly>(tiles, pt, vp + kb * cols * parts * 512, cols, pairs, corr, acc);
    }
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), l);
    for (long c = 0; c < cols; ++c) {  // O's rows: 16 columns of d at a time, transposed back
      __m512i colv[16], t[16];
      for (int i = 0; i < 16; ++i) colv[i] = _mm512_castps_si512(_mm512_mul_ps(_mm512_load_ps(acc + 16 * (16 * c + i)), inv));
      transpose16(colv, t);
      for (long r = 0; r < rows; ++r) {
        T *o = out + ((t0 + r) * hq + h) * d + 16 * c;
        if constexpr (kHiOnly)
          _mm256_storeu_si256((__m256i *)o, (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(t[r])));
        else
          _mm512_storeu_ps(o, _mm512_castsi512_ps(t[r]));
      }
    }
  }
}

// The batch's sequences of kTilePrompt or more query tokens attended on Tiles (see above):
// returns flags[num_seqs] of the sequences done (malloc'd), or NULL if none was (too short, d not
// a multiple of 32, the tiles not allowed, no memory).
template <typename Tiles, typename T, typename C>
static bool *tile_prompts(T *out, const T *q, long q_stride, const C *kc, const C *vc, const int32_t *starts,
                         const int32_t *seq_lens, const int32_t *tables, long table_stride, long num_seqs, long hq,
                         long hk, long d, long block_size, float scale, long window, const float *lut, int code,
                         float k_scale, float v_scale, int nthreads) {
  typedef typename RowOf<C>::type R;
  constexpr bool kHiOnly = std::is_same<T, bf16_t>::value;
  constexpr long parts = kHiOnly ? 1 : 2;
  if (d % 32 || d > kMaxHead || !Tiles::ready()) return NULL;
  struct Seq {
    long s, q_len, n_keys, blocks;  // blocks: of 32 keys
    uint16_t *kv;                   // per kv head: K's tiles, then V's (blocks * 32 * d * parts values each)
  };
  Seq *seqs = (Seq *)malloc(num_seqs * sizeof(Seq));
  long n = 0, values = 0;
  for (long s = 0; seqs && s < num_seqs; ++s) {
    const long q_len = starts[s + 1] - starts[s];
    if (q_len < kTilePrompt || seq_lens[s] < q_len) continue;
    seqs[n] = {s, q_len, seq_lens[s], (seq_lens[s] + 31) / 32, NULL};
    values += seqs[n++].blocks * 32 * d * parts * 2 * hk;
  }
  uint16_t *packed = n && values * 2 <= kTilePackMax ? (uint16_t *)aligned_alloc(64, values * 2) : NULL;
  if (!packed) {
    free(seqs);
    return NULL;
  }
  long pack_items = 0, items = 0;
  for (long i = 0, at = 0; i < n; ++i) {
    seqs[i].kv = packed + at;
    at += seqs[i].blocks * 32 * d * parts * 2 * hk;
    pack_items += seqs[i].blocks * hk;
    items += (seqs[i].q_len + 15) / 16 * hk;
  }
  const long kv_values = 32 * d * parts;  // a block of 32 keys' K (or V) tiles
  parallel_for(pack_items, 4, nthreads, true, [&](long lo, long hi) {  // (sequence, kv head, 32 keys)
    for (long item = lo; item < hi; ++item) {
      long i = 0, rest = item;
      while (rest >= seqs[i].blocks * hk) rest -= seqs[i++].blocks * hk;
      const Seq &sq = seqs[i];
      const long kvh = rest / sq.blocks, kb = rest % sq.blocks, j0 = 32 * kb;
      const long valid = sq.n_keys - j0 < 32 ? sq.n_keys - j0 : 32;
      const R *krow[kChunk], *vrow[kChunk];
      float kbuf[sizeof(C) == 1 ? kChunk : 1][kMaxHead], vbuf[sizeof(C) == 1 ? kChunk : 1][kMaxHead];
      cache_rows<C, R>(kc, vc, tables + sq.s * table_stride, j0, valid, block_size, hk, kvh, d, lut, code, k_scale,
                       v_scale, kbuf, vbuf, krow, vrow);
      uint16_t *kp = sq.kv + kvh * 2 * sq.blocks * kv_values, *vp = kp + sq.blocks * kv_values;
      tile_pack_keys<kHiOnly, R>(krow, valid, d, kp + kb * kv_values);
      tile_pack_keys<kHiOnly, R>(krow + 16, valid - 16, d, kp + kb * kv_values + kv_values / 2);
      tile_pack_values<kHiOnly, R>(vrow, valid, d, vp + kb * kv_values);
    }
  });
  const long group = hq / hk;
  parallel_for(items, 1, nthreads, true, [&](long lo, long hi) {  // (sequence, 16 tokens, kv head)
    Tiles unit;
    unit.begin();
    for (long item = lo; item < hi; ++item) {
      long i = 0, rest = item;
      while (rest >= (seqs[i].q_len + 15) / 16 * hk) rest -= (seqs[i++].q_len + 15) / 16 * hk;
      const Seq &sq = seqs[i];
      const long tiles = (sq.q_len + 15) / 16, qt = tiles - 1 - rest / hk, kvh = rest % hk;  // the longest first
      const long r0 = 16 * qt, rows = sq.q_len - r0 < 16 ? sq.q_len - r0 : 16;
      const uint16_t *kp = sq.kv + kvh * 2 * sq.blocks * kv_values, *vp = kp + sq.blocks * kv_values;
      tile_prompt_item<T, Tiles>(unit, out, q, q_stride, starts[sq.s] + r0, rows, sq.n_keys - sq.q_len + r0 + 1,
                                 window, hq, kvh, group, d, scale, kp, vp);
    }
    unit.end();
  });
  bool *done = (bool *)calloc(num_seqs, sizeof(bool));
  for (long i = 0; done && i < n; ++i) done[seqs[i].s] = true;
  free(packed);
  free(seqs);
  return done;
}
#endif
