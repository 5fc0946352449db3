// One-byte KV cache formats (plugins/src/plugins/kv_cache.py), bit-exact with torch:
// E4M3 = torch.float8_e4m3fn (bias 7, no infinities, 0x7f = NaN, largest 448) and
// E5M2 = torch.float8_e5m2 (the top byte of an IEEE fp16, largest finite 57344).
// A cache stores x / scale, rounded to nearest even and saturated at the largest value.
#pragma once

#include "common.h"

// cache dtype codes shared with Python (plugins/src/plugins/cpu_native/kernels.py),
// after the compute dtypes CK_F32 and CK_BF16 (16/32-bit caches: those and common.h's CK_F16)
enum { CK_FP8_E4M3 = 2, CK_FP8_E5M2 = 3 };

namespace CK_NS {

static inline bool is_fp8(int code) { return code == CK_FP8_E4M3 || code == CK_FP8_E5M2; }

static inline float fp8_to_f32(uint8_t b, int code) {
  if (code == CK_FP8_E5M2) return half_to_f32((uint16_t)(b << 8));
  const uint32_t sign = (uint32_t)(b & 0x80u) << 24, exp = (b >> 3) & 15u, man = b & 7u;
  if (exp == 15 && man == 7) return bits_to_float(sign | 0x7fc00000u);
  if (exp == 0) {  // subnormal: man * 2^-9
    const float f = (float)man * 0.001953125f;
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 120u) << 23) | (man << 20));  // bias 7 -> 127
}

// x in the format `code`: round to nearest even at the binade's step, saturate, keep the sign
static inline uint8_t f32_to_fp8(float x, int code) {
  const int man_bits = code == CK_FP8_E4M3 ? 3 : 2, bias = code == CK_FP8_E4M3 ? 7 : 15;
  const float max = code == CK_FP8_E4M3 ? 448.0f : 57344.0f;
  const uint32_t u = float_to_bits(x);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  float a = bits_to_float(u & 0x7fffffffu);
  if (a != a) return sign | 0x7fu;  // NaN (E5M2: 0x7f is a NaN too)
  a = fmin_(a, max);
  const int min_exp = 1 - bias;  // exponent of the smallest normal; subnormals share its step
  int e = (int)((float_to_bits(a) >> 23) & 0xffu) - 127;
  if (e < min_exp) e = min_exp;
  const float step = bits_to_float((uint32_t)(e - man_bits + 127) << 23);
  const uint32_t q = (uint32_t)__builtin_rintf(a / step);  // a / step is exact; rint: ties to even
  // q counts steps from the binade's base: q < 2^man_bits only in the subnormal range, and
  // q == 2^(man_bits + 1) (rounded up into the next binade) carries into the exponent
  return sign | (uint8_t)(((uint32_t)(e + bias - 1) << man_bits) + q);
}

}  // namespace CK_NS
