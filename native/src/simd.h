// The 8-float vector the kernels' vector paths are written against, one definition per
// ISA: __m256 on x86 (AVX2 and up), two float32x4_t on aarch64 NEON, two __vector float
// on s390x (z14 and up). Intrinsics live here, in the int8 group kernels of quant.cpp and in
// the x86 files beside the kernels (amx.h, matvec_avx512.h, matvec_amx.h, attention_tiles.h);
// matvec.cpp and attention.cpp (but for its F16C fp8 row decode) use v8 alone, so their
// skeleton is the same code on every ISA. CK_V8 is undefined in the scalar build: the kernels
// then take their plain C++ paths.
#pragma once

#include "common.h"

#if defined(__AVX2__)
#include <immintrin.h>
#define CK_V8 1
#if defined(__AVX512F__) && !defined(__clang__)
// GCC 12's 512-bit intrinsics pass an undefined vector as the unused merge source, which its
// -W(maybe-)uninitialized reports wherever one is inlined (a false positive): off in the
// AVX-512 builds of every file with vector paths (the AVX2 and other builds of the same code
// still warn)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON) && !defined(CK_NO_SIMD)
#include <arm_neon.h>
#define CK_V8 1
#elif defined(__s390x__) && defined(__VEC__) && !defined(CK_NO_SIMD)
#include <vecintrin.h>
#define CK_V8 1
#endif

#if defined(CK_V8)
namespace CK_NS {

#define CK_INLINE __attribute__((always_inline)) static inline

#if defined(__AVX2__)
typedef __m256 v8;

CK_INLINE v8 v8_zero() { return _mm256_setzero_ps(); }
CK_INLINE v8 v8_set1(float x) { return _mm256_set1_ps(x); }
CK_INLINE v8 v8_load(const float *p) { return _mm256_loadu_ps(p); }
CK_INLINE v8 v8_load(const bf16_t *p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#if defined(__F16C__)
CK_INLINE v8 v8_load(const f16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#else
CK_INLINE v8 v8_load(const f16_t *p) {
  float f[8];
  for (int i = 0; i < 8; ++i) f[i] = to_f32(p[i]);
  return _mm256_loadu_ps(f);
}
#endif
CK_INLINE void v8_store(float *p, v8 v) { _mm256_storeu_ps(p, v); }
CK_INLINE v8 v8_add(v8 a, v8 b) { return _mm256_add_ps(a, b); }
CK_INLINE v8 v8_mul(v8 a, v8 b) { return _mm256_mul_ps(a, b); }
CK_INLINE v8 v8_fma(v8 a, v8 b, v8 c) { return _mm256_fmadd_ps(a, b, c); }  // a * b + c
// keep v in its register: GCC otherwise folds a load into every FMA as a memory operand
// (CPUs with one 256-bit load a cycle, like Zen 1, then wait on loads)
CK_INLINE void v8_keep(v8 &v) { __asm__("" : "+x"(v)); }
CK_INLINE float v8_hsum(v8 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// out[i] = lane sum of v[i], i < 8: 9 instructions where 8 v8_hsum take 48
CK_INLINE void v8_hsum8x8(const v8 *v, float *out) {
  const __m256 ab = _mm256_hadd_ps(v[0], v[1]), cd = _mm256_hadd_ps(v[2], v[3]);
  const __m256 ef = _mm256_hadd_ps(v[4], v[5]), gh = _mm256_hadd_ps(v[6], v[7]);
  // abcd = [sum a0-3, b0-3, c0-3, d0-3 | sum a4-7, b4-7, c4-7, d4-7]
  const __m256 abcd = _mm256_hadd_ps(ab, cd), efgh = _mm256_hadd_ps(ef, gh);
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(abcd, efgh, 0x20),
                                      _mm256_permute2f128_ps(abcd, efgh, 0x31)));
}
// 8 int8 as floats
CK_INLINE v8 v8_from_i8(const uint8_t *p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
// the low and the high nibbles of 8 bytes, minus off, as floats
CK_INLINE void v8_nibbles(const uint8_t *p, int off, v8 *lo, v8 *hi) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
  const __m256i mask = _mm256_set1_epi32(0x0f), o = _mm256_set1_epi32(off);
  *lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, mask), o));
  *hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), o));
}
// the f16 pair (d, m) at p, each broadcast: one conversion for both
CK_INLINE void v8_half_pair(const uint8_t *p, v8 *d, v8 *m) {
  int32_t dm;
  memcpy(&dm, p, 4);
  const __m256 pairs = _mm256_cvtph_ps(_mm_set1_epi32(dm));
  *d = _mm256_permute_ps(pairs, 0x00);
  *m = _mm256_permute_ps(pairs, 0x55);
}

#else  // two 4-float vectors: aarch64 NEON or s390x z/Architecture vector

#if defined(__aarch64__)
typedef float32x4_t v4;
CK_INLINE v4 v4_set1(float x) { return vdupq_n_f32(x); }
CK_INLINE v4 v4_load(const float *p) { return vld1q_f32(p); }
CK_INLINE void v4_store(float *p, v4 v) { vst1q_f32(p, v); }
CK_INLINE v4 v4_fma(v4 a, v4 b, v4 c) { return vfmaq_f32(c, a, b); }
CK_INLINE float v4_hsum(v4 v) { return vaddvq_f32(v); }
CK_INLINE void v4_keep(v4 &v) { __asm__("" : "+w"(v)); }
#else
typedef __vector float v4;
CK_INLINE v4 v4_set1(float x) { return vec_splats(x); }
CK_INLINE v4 v4_load(const float *p) { return vec_xl(0, p); }
CK_INLINE void v4_store(float *p, v4 v) { vec_xst(v, 0, p); }
CK_INLINE v4 v4_fma(v4 a, v4 b, v4 c) { return vec_madd(a, b, c); }
CK_INLINE float v4_hsum(v4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }
CK_INLINE void v4_keep(v4 &v) { __asm__("" : "+v"(v)); }
#endif

struct v8 {
  v4 a, b;  // lanes 0-3, 4-7
};

CK_INLINE v8 v8_set1(float x) { return {v4_set1(x), v4_set1(x)}; }
CK_INLINE v8 v8_zero() { return v8_set1(0.0f); }
CK_INLINE v8 v8_load(const float *p) { return {v4_load(p), v4_load(p + 4)}; }
CK_INLINE void v8_store(float *p, v8 v) {
  v4_store(p, v.a);
  v4_store(p + 4, v.b);
}
CK_INLINE v8 v8_add(v8 x, v8 y) { return {x.a + y.a, x.b + y.b}; }
CK_INLINE v8 v8_mul(v8 x, v8 y) { return {x.a * y.a, x.b * y.b}; }
CK_INLINE v8 v8_fma(v8 x, v8 y, v8 z) { return {v4_fma(x.a, y.a, z.a), v4_fma(x.b, y.b, z.b)}; }
CK_INLINE void v8_keep(v8 &v) {
  v4_keep(v.a);
  v4_keep(v.b);
}
CK_INLINE float v8_hsum(v8 v) { return v4_hsum(v.a + v.b); }
CK_INLINE void v8_hsum8x8(const v8 *v, float *out) {
  for (int i = 0; i < 8; ++i) out[i] = v8_hsum(v[i]);
}

#if defined(__aarch64__)
CK_INLINE v8 v8_load(const bf16_t *p) {  // bf16 -> f32: the 16 bits become the high half
  const uint16x8_t u = vld1q_u16(p);
  return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(u), 16)),
          vreinterpretq_f32_u32(vshll_high_n_u16(u, 16))};
}
CK_INLINE v8 v8_load(const f16_t *p) {  // two FCVTLs: base ARMv8
  const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)p));
  return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
}
CK_INLINE v8 v8_from_i8(const uint8_t *p) {
  const int16x8_t w = vmovl_s8(vld1_s8((const int8_t *)p));
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w))};
}
CK_INLINE v8 v8_from_i16(int16x8_t w) {
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w))};
}
CK_INLINE void v8_nibbles(const uint8_t *p, int off, v8 *lo, v8 *hi) {
  const uint8x8_t v = vld1_u8(p);
  const int16x8_t o = vdupq_n_s16((int16_t)off);
  *lo = v8_from_i16(vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(vand_u8(v, vdup_n_u8(0x0f)))), o));
  *hi = v8_from_i16(vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(vshr_n_u8(v, 4))), o));
}
#else
CK_INLINE v8 v8_load(const bf16_t *p) {  // big-endian: (bits, 0) as a 32-bit lane is bits << 16
  const __vector unsigned short u = vec_xl(0, p), z = vec_splats((unsigned short)0);
  return {(v4)vec_mergeh(u, z), (v4)vec_mergel(u, z)};
}
CK_INLINE v8 v8_load(const f16_t *p) {  // no half conversion in z's vector facility
  float f[8];
  for (int i = 0; i < 8; ++i) f[i] = to_f32(p[i]);
  return v8_load(f);
}
#if __ARCH__ >= 13  // z15 (vector-enhancements facility 2): 32-bit int -> float in vector
CK_INLINE v8 v8_from_ints(const int32_t *w) {
  const __vector signed int a = vec_xl(0, w), b = vec_xl(16, w);
  return {vec_float(a), vec_float(b)};
}
#else  // z14 converts only 64-bit lanes: convert in scalar registers
CK_INLINE v8 v8_from_ints(const int32_t *w) {
  float f[8];
  for (int i = 0; i < 8; ++i) f[i] = (float)w[i];
  return v8_load(f);
}
#endif
CK_INLINE v8 v8_from_i8(const uint8_t *p) {
  int32_t w[8];
  for (int i = 0; i < 8; ++i) w[i] = (int8_t)p[i];
  return v8_from_ints(w);
}
CK_INLINE void v8_nibbles(const uint8_t *p, int off, v8 *lo, v8 *hi) {
  int32_t l[8], h[8];
  for (int i = 0; i < 8; ++i) {
    l[i] = (p[i] & 0x0f) - off;
    h[i] = (p[i] >> 4) - off;
  }
  *lo = v8_from_ints(l);
  *hi = v8_from_ints(h);
}
#endif

CK_INLINE void v8_half_pair(const uint8_t *p, v8 *d, v8 *m) {
  *d = v8_set1(read_half(p));
  *m = v8_set1(read_half(p + 2));
}
#endif

// The widest float vector of the build, for rows long enough to fill it (attention's head
// rows): __m512 (kVW = 16 lanes) on AVX-512F builds, v8 elsewhere. vw_hsum(v, out):
// out[i] = lane sum of v[i] for i < kVW.
#if defined(__AVX512F__)
typedef __m512 vw;
static const int kVW = 16;
CK_INLINE vw vw_zero() { return _mm512_setzero_ps(); }
CK_INLINE vw vw_set1(float x) { return _mm512_set1_ps(x); }
CK_INLINE vw vw_load(const float *p) { return _mm512_loadu_ps(p); }
CK_INLINE vw vw_load(const bf16_t *p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
CK_INLINE vw vw_load(const f16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
CK_INLINE void vw_store(float *p, vw v) { _mm512_storeu_ps(p, v); }
CK_INLINE vw vw_fma(vw a, vw b, vw c) { return _mm512_fmadd_ps(a, b, c); }
// 46 instructions for 16 sums: halves of pairs of vectors added (256-bit, then 128-bit
// halves), then within 128-bit lanes twice; lane 4L + e then holds the sum of vector
// {0, 8, 4, 12}[L] + {0, 2, 1, 3}[e], put in order by one permute
CK_INLINE void vw_hsum(const vw *v, float *out) {
  vw t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[i], t[i + 4], 0x88), _mm512_shuffle_f32x4(t[i], t[i + 4], 0xdd));
  for (int i = 0; i < 2; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[i], u[i + 2], 0x88), _mm512_shuffle_ps(u[i], u[i + 2], 0xdd));
  const vw z = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xdd));
  const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, z));
}
#else
typedef v8 vw;
static const int kVW = 8;
CK_INLINE vw vw_zero() { return v8_zero(); }
CK_INLINE vw vw_set1(float x) { return v8_set1(x); }
CK_INLINE vw vw_load(const float *p) { return v8_load(p); }
CK_INLINE vw vw_load(const bf16_t *p) { return v8_load(p); }
CK_INLINE vw vw_load(const f16_t *p) { return v8_load(p); }
CK_INLINE void vw_store(float *p, vw v) { v8_store(p, v); }
CK_INLINE vw vw_fma(vw a, vw b, vw c) { return v8_fma(a, b, c); }
CK_INLINE void vw_hsum(const vw *v, float *out) { v8_hsum8x8(v, out); }
#endif

#undef CK_INLINE
}  // namespace CK_NS
#endif  // CK_V8
