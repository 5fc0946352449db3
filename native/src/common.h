// Shared helpers of the per-ISA kernel translation units.
//
// Every kernel source is compiled once per ISA variant of the target (x86-64: scalar,
// avx2, avx512, avx512vnni, avx512bf16, avx512amx; aarch64: scalar, neon, neon_bf16; s390x: scalar, z14,
// z15) with that variant's -m flags and CK_ISA set to its name. Everything here lives in a
// per-ISA namespace so no inline function compiled with, say, AVX-512 flags can be
// picked by the linker for the AVX2 or scalar build (an ODR trap that would raise
// SIGILL). For the same reason the kernel sources use no STL templates.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__ARM_FEATURE_BF16_SCALAR_ARITHMETIC)
#include <arm_bf16.h>
#endif

#include "pool.h"

#ifndef CK_ISA
#error "CK_ISA must name the ISA this translation unit is built for"
#endif

#define CK_CAT2(a, b, c) a##b##c
#define CK_CAT(a, b, c) CK_CAT2(a, b, c)
// exported entry point of this ISA: ck_<isa>_<name>
#define CK_FN(name) CK_CAT(ck_, CK_ISA, _##name)
#define CK_NS CK_CAT(ck_, CK_ISA, _impl)

// dtype codes shared with Python (plugins/src/plugins/cpu_native/library.py); CK_F16 is a
// KV cache dtype only (attention.cpp), after fp8.h's one-byte ones
enum { CK_F32 = 0, CK_BF16 = 1, CK_F16 = 4 };

namespace CK_NS {

typedef uint16_t bf16_t;

static inline float bits_to_float(uint32_t u) { return __builtin_bit_cast(float, u); }
static inline uint32_t float_to_bits(float f) { return __builtin_bit_cast(uint32_t, f); }

static inline float to_f32(float x) { return x; }
static inline float to_f32(bf16_t x) { return bits_to_float((uint32_t)x << 16); }

// round-to-nearest-even like torch; NaN stays a (quiet) NaN
static inline void from_f32(float x, float *out) { *out = x; }
#if defined(__ARM_FEATURE_BF16_SCALAR_ARITHMETIC)
static inline void from_f32(float x, bf16_t *out) {  // one BFCVT (FEAT_BF16)
  *out = __builtin_bit_cast(bf16_t, vcvth_bf16_f32(x));
}
#else
static inline void from_f32(float x, bf16_t *out) {
  uint32_t u = float_to_bits(x);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  *out = (bf16_t)((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r);
}
#endif

static inline float half_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#elif defined(__aarch64__)
  return (float)__builtin_bit_cast(__fp16, h);  // one FCVT: base ARMv8
#else
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    float f = (float)mant * 5.9604644775390625e-8f;  // subnormal: mant * 2^-24
    return sign ? -f : f;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
}

// an IEEE half of a float16 KV cache: a type of its own (bf16_t is a uint16_t too)
struct f16_t {
  uint16_t bits;
};
static inline float to_f32(f16_t x) { return half_to_f32(x.bits); }
// round-to-nearest-even like torch's cast: past 65504 (from 65520 on) inf, NaN a quiet NaN
static inline void from_f32(float x, f16_t *out) {
#if defined(__F16C__)
  out->bits = (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__aarch64__)
  out->bits = __builtin_bit_cast(uint16_t, (__fp16)x);  // one FCVT, FPCR's default rounding
#else
  const uint32_t u = float_to_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, the top of its payload kept
    out->bits = (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  } else if (a >= 0x477ff000u) {  // 65520 and up (and inf): inf
    out->bits = (uint16_t)(sign | 0x7c00u);
  } else if (a < 0x38800000u) {  // below 2^-14: a subnormal half, mant * 2^-24 (exact scaling)
    out->bits = (uint16_t)(sign | (uint32_t)__builtin_rintf(bits_to_float(a) * 16777216.0f));
  } else {  // rebias the exponent, round 23 mantissa bits to 10 (a carry moves the exponent)
    const uint32_t r = a - (112u << 23);
    out->bits = (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
#endif
}

static inline float read_half(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return half_to_f32(h);
}

static inline float fmin_(float a, float b) { return a < b ? a : b; }
static inline float fmax_(float a, float b) { return a > b ? a : b; }
static inline int imin_(int a, int b) { return a < b ? a : b; }

// exp(x) for x <= ~88, written so that loops over it auto-vectorize (no libm call).
// 2^n * p(r) with r in [-ln2/2, ln2/2]; relative error ~2e-7. Underflows to 0.
static inline float fast_exp(float x) {
  x = fmax_(x, -87.0f);
  x = fmin_(x, 88.0f);
  float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = (int32_t)n + 127;
  return p * bits_to_float((uint32_t)e << 23);
}

// body(lo, hi) over [0, n) in chunks of `chunk` on the pool (pool.cpp); all inline when
// !parallel (too little work to be worth waking another thread)
template <typename F>
static void parallel_for(long n, long chunk, int nthreads, bool parallel, F &&body) {
  if (n <= 0) return;
  chunk = chunk < 1 ? 1 : chunk;
  struct Job {
    F *body;
    long n, chunk;
  } job = {&body, n, chunk};
  const long chunks = (n + chunk - 1) / chunk;
  if (!parallel || nthreads <= 1 || chunks <= 1) {
    body(0L, n);
    return;
  }
  ck_parallel(
      [](void *p, long i) {
        const Job *j = (const Job *)p;
        const long lo = i * j->chunk, hi = lo + j->chunk < j->n ? lo + j->chunk : j->n;
        (*j->body)(lo, hi);
      },
      &job, chunks, nthreads);
}

}  // namespace CK_NS
